package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Store is Kiln's view of Redis. It is safe for concurrent use; create one per
// process with New and Close it at shutdown.
//
// A Store is its parts, each the store of one concern (its keys, scripts
// and logic) over the one connection they share, and each usable alone
// (store.Budgets, say, for a component that needs only budgets). Their
// methods are the Store's: callers see one Store, and a caller's small
// interface may take a Store, or a part when that part has every method
// the interface names (producer's SessionStore also names Fleet's
// WorkerInstance, so it takes a Store).
type Store struct {
	*conn
	*Jobs
	*Results
	*Claims
	*Sessions
	*Budgets
	*Quotas
	*Fleet
	closeOnce sync.Once
	closeErr  error
}

// conn is what the Store's parts share: the client, the key space, the
// configuration it was made with and its logger. Nothing changes it once
// New has made it.
type conn struct {
	rdb    *redis.Client
	keys   keyspace
	jobTTL int64 // Config.JobTTL in milliseconds, as the scripts want it
	cfg    Config
	log    *slog.Logger
}

// Jobs is the store of job records: created, read and listed (jobs.go,
// jobindex.go), run under leases, finished and canceled by the scripts of
// scripts.go, their terminal state confirmed on replicas (replicated.go),
// published (publish.go), restored (restore.go), and their callbacks'
// state (callback.go). A record that names a cache hit's result copy reads
// as one holding the result (hittx.go).
type Jobs struct {
	*conn
	index jobIndex
	// repl makes a job's terminal write wait for replicas (replicated.go).
	repl replicas
}

// Results is the result cache: its entries (results.go), the entries this
// process read lately (known.go), and the records of jobs answered from
// it, the cache hits (alias.go, known.go, hittx.go), which enter the job
// index as Jobs' records do.
type Results struct {
	*conn
	index jobIndex
	known knownResults // result-cache entries read lately (known.go)
	// knownHits batches the cache hits' transactions (hittx.go, batch.go).
	knownHits batcher[*hitCall]
	// epoch is when the Results were made: since measures this process's
	// time from it on the monotonic clock (hittx.go's copy refreshes).
	epoch time.Time
}

// Claims is the store of claims on a name: Idempotency-Key claims
// (idempotency.go) and in-flight claims on a cache key (inflight.go).
type Claims struct{ *conn }

// Sessions is the sessions' catalog: each session's record and its holder
// (sessions.go, sessions_holder.go), its calls (sessions_calls.go) and its
// pauses (sessions_pause.go).
type Sessions struct{ *conn }

// Budgets is the store of tenants' budgets and the reservations their runs
// hold (budget.go).
type Budgets struct{ *conn }

// Quotas is the store of tenants' running counts: the submission rate and
// CPU-day quota (quota.go), CPU reservations (cpu_reserve.go), what their
// jobs put in the object store (stored.go) and what they append to their
// audit logs (auditbound.go).
type Quotas struct{ *conn }

// Fleet is the store of what the workers publish about themselves: the
// runtime registry producers read (runtimes.go) and the leases on worker
// ids (worker_lease.go).
type Fleet struct{ *conn }

// newStore makes the Store's parts over c.
func newStore(c *conn) *Store {
	index := jobIndex{c}
	s := &Store{
		conn:     c,
		Jobs:     &Jobs{conn: c, index: index, repl: replicas{conn: c, min: c.cfg.MinReplicas, wait: c.cfg.ReplicaWait}},
		Results:  &Results{conn: c, index: index, epoch: time.Now()},
		Claims:   &Claims{c},
		Sessions: &Sessions{c},
		Budgets:  &Budgets{c},
		Quotas:   &Quotas{c},
		Fleet:    &Fleet{c},
	}
	s.knownHits.send = s.sendHits
	return s
}

// New validates cfg, connects to Redis and PINGs it. On failure the error
// names the address and database it tried (never the password) and wraps
// ErrUnavailable when the server could not be reached.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opt, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("cache config: URL: %w", err) // unreachable after Validate
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = dialTimeout
	}
	if opt.ReadTimeout == 0 {
		opt.ReadTimeout = ioTimeout
	}
	if opt.WriteTimeout == 0 {
		opt.WriteTimeout = ioTimeout
	}
	if opt.PoolTimeout == 0 {
		opt.PoolTimeout = poolTimeout
	}
	if opt.MaxRetries == 0 {
		opt.MaxRetries = maxRetries
	}
	opt.DialerRetries = dialAttempts
	opt.ContextTimeoutEnabled = true
	// CLIENT SETINFO only labels connections, costs a round trip per new
	// connection, and servers before 7.2 reject it.
	opt.DisableIdentity = true
	// Maintenance notifications are a Redis Enterprise/Cloud feature; asking
	// an open-source server for them only costs a round trip per connection.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}

	c := &conn{
		rdb:    newClient(cfg, opt),
		keys:   keyspace{prefix: cfg.Prefix},
		jobTTL: cfg.JobTTL.Milliseconds(),
		cfg:    cfg,
		log:    cfg.Logger,
	}
	s := newStore(c)
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		if cfg.connectLater && errors.Is(classify(err), ErrUnavailable) {
			s.log.WarnContext(ctx, "redis is not answering yet; connecting when it does",
				slog.String("addr", opt.Addr), slog.Any("error", err))
			return s, nil
		}
		_ = s.rdb.Close()
		return nil, fmt.Errorf("connect to redis at %s (db %d): %w", serverDesc(cfg, opt), opt.DB, classify(err))
	}
	s.Jobs.repl.warnFew(ctx)
	s.log.DebugContext(ctx, "cache connected", slog.String("addr", opt.Addr), slog.Int("db", opt.DB), slog.String("prefix", cfg.Prefix))
	return s, nil
}

// Ping checks that Redis answers; readiness probes call it.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fail("ping redis", err)
	}
	return nil
}

// Close releases the connection pool. It is idempotent; calls on a closed
// Store fail with ErrUnavailable.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.rdb.Close() })
	return s.closeErr
}
