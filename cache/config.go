package cache

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults applied to zero Config fields.
const (
	URLDefault       = "redis://127.0.0.1:6379/0"
	PrefixDefault    = "kiln:"
	JobTTLDefault    = 24 * time.Hour
	ResultTTLDefault = 24 * time.Hour
	// ReplicaWaitDefault bounds one WAIT for MinReplicas: a healthy replica
	// acknowledges in about a millisecond, so running out of it means the
	// replica is cut off or a failover is under way.
	ReplicaWaitDefault = time.Second
)

// Network limits applied unless the URL sets them (go-redis URL parameters
// dial_timeout, read_timeout, write_timeout, pool_timeout, max_retries).
// They are short on purpose: a producer must be able to answer 503 within a
// couple of seconds of Redis going away instead of holding requests open.
const (
	dialTimeout  = 1 * time.Second
	ioTimeout    = 1 * time.Second // read and write
	poolTimeout  = 2 * time.Second
	maxRetries   = 1 // one retry re-dials after a dropped connection; every script is safe to repeat
	dialAttempts = 1 // one dial per attempt; the command retries above already re-dial
)

// Config configures a Store. Zero fields take the default named beside them.
type Config struct {
	// URL is the Redis URL, e.g. "redis://:password@host:6379/0" or
	// "rediss://..." for TLS. Default URLDefault ("redis://127.0.0.1:6379/0").
	URL string
	// Prefix starts every key, so several deployments can share one server.
	// Default PrefixDefault ("kiln:").
	Prefix string
	// JobTTL is how long a job record, its in-flight claim and Idempotency-Key
	// claims are kept after creation. Updates do not extend it. Default 24h.
	JobTTL time.Duration
	// ResultTTL is how long a result-cache entry answers identical jobs.
	// Default 24h.
	ResultTTL time.Duration
	// Logger receives the package's few log lines. Default: discard.
	Logger *slog.Logger
	// SentinelAddrs, when set, makes the Store find the Redis primary through
	// these Redis Sentinels (host:port each) and follow their failovers; URL
	// then gives only the credentials, database, TLS and timeouts (its host
	// is not used). Default: none (URL's host is the server).
	SentinelAddrs []string
	// SentinelMaster is the master name the Sentinels monitor ("sentinel
	// monitor <name> ..." in sentinel.conf). Required with SentinelAddrs.
	SentinelMaster string
	// SentinelPassword authenticates to the Sentinels themselves (their
	// requirepass), not to Redis. Default: none.
	SentinelPassword string
	// MinReplicas is how many replicas must hold a job's terminal state
	// before Finish, Abandon and ConfirmTerminal report success: after the
	// write they send Redis WAIT on the same connection and, when fewer
	// replicas acknowledged it within ReplicaWait, fail with an error
	// wrapping ErrNotReplicated (the write stands on the primary; repeating
	// the call is safe). A worker acks a job's message only after that
	// succeeds, so a failover to a replica cannot lose a result whose
	// message is gone (replicated.go). Set 1 with Sentinel; with it, give
	// the primary two replicas, or results wait while one is away.
	// Default 0: no WAIT (a single server, where there is nothing to wait for).
	MinReplicas int
	// ReplicaWait is how long one WAIT for MinReplicas waits. Default
	// ReplicaWaitDefault (1s).
	ReplicaWait time.Duration

	// connectLater: set by Open.
	connectLater bool
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, URLDefault)
	c.Prefix = cmp.Or(c.Prefix, PrefixDefault)
	c.JobTTL = cmp.Or(c.JobTTL, JobTTLDefault)
	c.ResultTTL = cmp.Or(c.ResultTTL, ResultTTLDefault)
	c.ReplicaWait = cmp.Or(c.ReplicaWait, ReplicaWaitDefault)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first unusable field: a URL go-redis cannot parse, a
// negative MinReplicas, or a TTL or wait that is negative or below Redis's
// one-millisecond resolution.
// Zero fields are valid (they take defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	if _, err := redis.ParseURL(c.URL); err != nil {
		return fmt.Errorf("cache config: URL: %w", err)
	}
	if err := c.validateSentinel(); err != nil {
		return err
	}
	if c.MinReplicas < 0 {
		return fmt.Errorf("cache config: MinReplicas is %d; it must be 0 (no WAIT) or more", c.MinReplicas)
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"JobTTL", c.JobTTL}, {"ResultTTL", c.ResultTTL}, {"ReplicaWait", c.ReplicaWait}} {
		if f.v < time.Millisecond {
			return fmt.Errorf("cache config: %s is %v; it must be at least 1ms (or zero for the default)", f.name, f.v)
		}
	}
	return nil
}
