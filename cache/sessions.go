package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// The session catalog: which worker holds a session (fenced by its
// incarnation: every change a worker makes names the incarnation it holds,
// and one that lost the session to another worker is refused), its calls in
// the order they were accepted, each executed at most once, with its
// result, and the checkpoint of its files.
//
//	<prefix>session:<id>              hash    the session (fields below), expires with its lifetime + retention
//	<prefix>session:<id>:call:<seq>   hash    a call: state (queued|running|done), spec, result, inc
//	<prefix>session:<id>:idem:<sha>   string  Idempotency-Key → seq
//	<prefix>sessions:<tenant token>   zset    the tenant's live sessions, scored by expiry (unix ms)
//	<prefix>sessions:paused:<token>   zset    the tenant's paused sessions, likewise
//
// Session fields: tenant, runtime, status, worker, instance (the worker
// process's lease token), inc, created, expires, idle_s, idle_until (unix
// ms; meaningful while no call is pending), mem, limits (JSON), restore,
// image, digest, seq (calls accepted), done (calls ended), fresh ("1": the
// next call finds a fresh interpreter), note (why), ended_reason, files
// (the checkpoint: JSON []job.SessionFileEntry), init (JSON []job.File,
// the files to place before the first call), meta (JSON job.Metadata, the
// caller's labels), pause ("1": the API asked the holder to pause it),
// paused_at (unix ms), resumed ("1": coming back from a pause), restored
// (what its last resume brought back).

// Session errors.
var (
	// ErrSessionFenced: the worker no longer holds the session.
	ErrSessionFenced = errors.New("the session is held by another incarnation")
	// ErrSessionEnded: the session has ended.
	ErrSessionEnded = errors.New("the session has ended")
	// ErrSessionQueueFull: the session's queue of calls is full.
	ErrSessionQueueFull = errors.New("the session's queue of calls is full")
	// ErrSessionKeyReused: an Idempotency-Key came with another call.
	ErrSessionKeyReused = errors.New("the Idempotency-Key was used for another call of the session")
	// ErrSessionQuota: the tenant has as many live sessions as allowed.
	ErrSessionQuota = errors.New("too many live sessions")
)

// sessionRetention is how long a session's record outlives its lifetime.
const sessionRetention = time.Hour

func (k keyspace) session(id string) string { return k.prefix + "session:" + id }
func (k keyspace) sessionCall(id string, seq int64) string {
	return k.session(id) + ":call:" + strconv.FormatInt(seq, 10)
}
func (k keyspace) sessionIdem(id, key string) string {
	sum := sha256.Sum256([]byte(key))
	return k.session(id) + ":idem:" + hex.EncodeToString(sum[:])
}
func (k keyspace) tenantSessions(tenant string) string {
	return k.prefix + "sessions:" + job.TenantToken(tenant)
}
func (k keyspace) tenantPausedSessions(tenant string) string {
	return k.prefix + "sessions:paused:" + job.TenantToken(tenant)
}

// SessionRecord is a session's catalog entry.
type SessionRecord struct {
	ID, Tenant, Runtime, Status string
	Worker, Instance            string
	Inc                         int
	Created, Expires, IdleUntil time.Time
	IdleTimeout                 time.Duration
	MemoryMB                    int64
	Limits                      job.Limits
	Restore                     string
	Image                       job.Image
	Seq, Done                   int64
	Fresh                       bool
	Note, EndedReason           string
	Files                       []job.SessionFileEntry
	// Variables is the interpreter's variables as its last pause kept
	// them (/work/job.SessionVariablesFile in the checkpoint, never among
	// Files); nil when none were.
	Variables *job.SessionFileEntry
	Init      []job.File
	// Network is the session's canonical allowlist (nil: none).
	Network *job.Network
	// Metadata is the caller's labels on the session.
	Metadata job.Metadata
	// Env is every call's environment under its own (job.SessionSpec.Env).
	Env map[string]string
	// PauseAsked: the API asked the holder to pause the session. Resumed:
	// it is coming back from a pause. Restored: what its last resume
	// brought back (job.RestoredFiles, ...). PausedAt: when it last paused.
	PauseAsked, Resumed bool
	Restored            string
	PausedAt            time.Time
}

// Expired says why the session is over at now ("" while it lives).
func (r SessionRecord) Expired(now time.Time) string {
	switch {
	case r.Status == job.SessionEnded:
		return r.EndedReason
	case !now.Before(r.Expires):
		return job.SessionEndLifetime
	}
	return ""
}

// Idle reports whether the live session has been idle past its idle
// timeout at now (no call waiting or running): its holder then pauses it.
func (r SessionRecord) Idle(now time.Time) bool {
	return r.Status != job.SessionPaused && r.Seq == r.Done && !r.IdleUntil.IsZero() && !now.Before(r.IdleUntil)
}

// View is the record as the API shows it.
func (r SessionRecord) View(now time.Time) job.Session {
	v := job.Session{ID: r.ID, Status: r.Status, Runtime: r.Runtime, Image: r.Image, CreatedAt: r.Created.UTC(),
		ExpiresAt: r.Expires.UTC(), IdleExpiresAt: r.IdleUntil.UTC(), Incarnation: r.Inc, Calls: r.Seq, MemoryMB: r.MemoryMB,
		IdleTimeoutS: int64(r.IdleTimeout / time.Second), MaxLifetimeS: int64(r.Expires.Sub(r.Created) / time.Second),
		Restore: r.Restore, Network: r.Network, EndedReason: r.EndedReason, Metadata: r.Metadata, Restored: r.Restored}
	if !r.PausedAt.IsZero() {
		at := r.PausedAt.UTC()
		v.PausedAt = &at
	}
	if why := r.Expired(now); why != "" {
		v.Status, v.EndedReason = job.SessionEnded, why
	}
	return v
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(s string) time.Time {
	n, _ := strconv.ParseInt(s, 10, 64)
	if n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

func parseSession(id string, m map[string]string) (SessionRecord, error) {
	r := SessionRecord{ID: id, Tenant: m["tenant"], Runtime: m["runtime"], Status: m["status"], Worker: m["worker"],
		Instance: m["instance"], Created: fromMS(m["created"]), Expires: fromMS(m["expires"]), IdleUntil: fromMS(m["idle_until"]),
		Restore: m["restore"], Image: job.Image{Name: m["image"], Digest: m["digest"]}, Fresh: m["fresh"] == "1",
		Note: m["note"], EndedReason: m["ended_reason"], PauseAsked: m["pause"] == "1", Resumed: m["resumed"] == "1",
		Restored: m["restored"], PausedAt: fromMS(m["paused_at"])}
	r.Inc, _ = strconv.Atoi(m["inc"])
	idle, _ := strconv.ParseInt(m["idle_s"], 10, 64)
	r.IdleTimeout = time.Duration(idle) * time.Second
	r.MemoryMB, _ = strconv.ParseInt(m["mem"], 10, 64)
	r.Seq, _ = strconv.ParseInt(m["seq"], 10, 64)
	r.Done, _ = strconv.ParseInt(m["done"], 10, 64)
	for field, dst := range map[string]any{"limits": &r.Limits, "files": &r.Files, "init": &r.Init, "network": &r.Network, "meta": &r.Metadata, "env": &r.Env} {
		if raw := m[field]; raw != "" {
			if err := json.Unmarshal([]byte(raw), dst); err != nil {
				return r, fmt.Errorf("session %s: field %s: %w", id, field, err)
			}
		}
	}
	// The variables a pause kept travel with the checkpoint's files, but
	// are not one of the session's files.
	if i := slices.IndexFunc(r.Files, func(e job.SessionFileEntry) bool { return e.Name == job.SessionVariablesFile }); i >= 0 {
		v := r.Files[i]
		r.Variables, r.Files = &v, slices.Delete(r.Files, i, i+1)
	}
	return r, nil
}

// createSessionScript: KEYS[1] session, KEYS[2] tenant's sessions; ARGV
// now ms, max live sessions, expires ms, retention ms, id, then field/value
// pairs. Returns 1, or 0 at the tenant's bound.
var createSessionScript = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIREAT', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
redis.call('PEXPIREAT', KEYS[2], tonumber(ARGV[3]) + tonumber(ARGV[4]))
return 1
`)

// CreateSession records a new session (status starting, incarnation 0),
// unless its tenant already has maxLive live sessions (ErrSessionQuota).
func (s *Sessions) CreateSession(ctx context.Context, r SessionRecord, maxLive int) error {
	limits, _ := json.Marshal(r.Limits)
	init, _ := json.Marshal(r.Init)
	network, meta := "", ""
	if !r.Network.Empty() {
		b, _ := json.Marshal(r.Network)
		network = string(b)
	}
	if len(r.Metadata) > 0 {
		b, _ := json.Marshal(r.Metadata)
		meta = string(b)
	}
	env := ""
	if len(r.Env) > 0 {
		b, _ := json.Marshal(r.Env)
		env = string(b)
	}
	args := []any{ms(r.Created), maxLive, ms(r.Expires), sessionRetention.Milliseconds(), r.ID,
		"tenant", r.Tenant, "runtime", r.Runtime, "status", job.SessionStarting, "inc", 0, "created", ms(r.Created),
		"expires", ms(r.Expires), "idle_s", int64(r.IdleTimeout / time.Second), "mem", r.MemoryMB, "limits", string(limits),
		"restore", r.Restore, "seq", 0, "done", 0, "init", string(init), "fresh", "0", "network", network, "meta", meta, "env", env}
	ok, err := createSessionScript.Run(ctx, s.rdb, []string{s.keys.session(r.ID), s.keys.tenantSessions(r.Tenant)}, args...).Int()
	if err != nil {
		return fail("create session "+r.ID, err)
	}
	if ok == 0 {
		return fmt.Errorf("create session %s: %w (at most %d per tenant)", r.ID, ErrSessionQuota, maxLive)
	}
	return nil
}

// Session reads a session's record (ErrNotFound when there is none).
func (s *Sessions) Session(ctx context.Context, id string) (SessionRecord, error) {
	m, err := s.rdb.HGetAll(ctx, s.keys.session(id)).Result()
	if err != nil {
		return SessionRecord{}, fail("get session "+id, err)
	}
	if len(m) == 0 {
		return SessionRecord{}, fmt.Errorf("session %s: %w", id, ErrNotFound)
	}
	return parseSession(id, m)
}

// TenantSessions lists tenant's live and paused sessions, those that end
// first first.
func (s *Sessions) TenantSessions(ctx context.Context, tenant string, now time.Time) ([]SessionRecord, error) {
	by := &redis.ZRangeBy{Min: "(" + strconv.FormatInt(ms(now), 10), Max: "+inf"}
	ids, err := s.rdb.ZRangeByScore(ctx, s.keys.tenantSessions(tenant), by).Result()
	if err != nil {
		return nil, fail("list sessions", err)
	}
	paused, err := s.rdb.ZRangeByScore(ctx, s.keys.tenantPausedSessions(tenant), by).Result()
	if err != nil {
		return nil, fail("list sessions", err)
	}
	ids = append(ids, paused...)
	out := make([]SessionRecord, 0, len(ids))
	for _, id := range ids {
		r, err := s.Session(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.Tenant == tenant {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b SessionRecord) int { return a.Expires.Compare(b.Expires) })
	return out, nil
}

// endSessionScript: KEYS[1] session, KEYS[2] tenant's sessions, KEYS[3]
// its paused sessions; ARGV reason, id. Returns 1 when this ended it.
var endSessionScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'status')
if not st or st == 'ended' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'ended', 'ended_reason', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1
`)

// EndSession ends a session for reason (idempotent).
func (s *Sessions) EndSession(ctx context.Context, id, tenant, reason string) (bool, error) {
	n, err := endSessionScript.Run(ctx, s.rdb, []string{s.keys.session(id), s.keys.tenantSessions(tenant), s.keys.tenantPausedSessions(tenant)}, reason, id).Int()
	if err != nil {
		return false, fail("end session "+id, err)
	}
	return n == 1, nil
}
