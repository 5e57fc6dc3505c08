package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
//
// Session fields: tenant, runtime, status, worker, instance (the worker
// process's lease token), inc, created, expires, idle_s, idle_until (unix
// ms; meaningful while no call is pending), mem, limits (JSON), restore,
// image, digest, seq (calls accepted), done (calls ended), fresh ("1": the
// next call finds a fresh interpreter), note (why), ended_reason, files
// (the checkpoint: JSON []job.SessionFileEntry), init (JSON []job.File,
// the files to place before the first call).

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
	Init                        []job.File
	// Network is the session's canonical allowlist (nil: none).
	Network *job.Network
}

// Expired says why the session is over at now ("" while it lives).
func (r SessionRecord) Expired(now time.Time) string {
	switch {
	case r.Status == job.SessionEnded:
		return r.EndedReason
	case !now.Before(r.Expires):
		return job.SessionEndLifetime
	case r.Seq == r.Done && !r.IdleUntil.IsZero() && !now.Before(r.IdleUntil):
		return job.SessionEndIdle
	}
	return ""
}

// View is the record as the API shows it.
func (r SessionRecord) View(now time.Time) job.Session {
	v := job.Session{ID: r.ID, Status: r.Status, Runtime: r.Runtime, Image: r.Image, CreatedAt: r.Created.UTC(),
		ExpiresAt: r.Expires.UTC(), IdleExpiresAt: r.IdleUntil.UTC(), Incarnation: r.Inc, Calls: r.Seq, MemoryMB: r.MemoryMB,
		IdleTimeoutS: int64(r.IdleTimeout / time.Second), MaxLifetimeS: int64(r.Expires.Sub(r.Created) / time.Second),
		Restore: r.Restore, Network: r.Network, EndedReason: r.EndedReason}
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
		Note: m["note"], EndedReason: m["ended_reason"]}
	r.Inc, _ = strconv.Atoi(m["inc"])
	idle, _ := strconv.ParseInt(m["idle_s"], 10, 64)
	r.IdleTimeout = time.Duration(idle) * time.Second
	r.MemoryMB, _ = strconv.ParseInt(m["mem"], 10, 64)
	r.Seq, _ = strconv.ParseInt(m["seq"], 10, 64)
	r.Done, _ = strconv.ParseInt(m["done"], 10, 64)
	for field, dst := range map[string]any{"limits": &r.Limits, "files": &r.Files, "init": &r.Init, "network": &r.Network} {
		if raw := m[field]; raw != "" {
			if err := json.Unmarshal([]byte(raw), dst); err != nil {
				return r, fmt.Errorf("session %s: field %s: %w", id, field, err)
			}
		}
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
func (s *Store) CreateSession(ctx context.Context, r SessionRecord, maxLive int) error {
	limits, _ := json.Marshal(r.Limits)
	init, _ := json.Marshal(r.Init)
	network := ""
	if !r.Network.Empty() {
		b, _ := json.Marshal(r.Network)
		network = string(b)
	}
	args := []any{ms(r.Created), maxLive, ms(r.Expires), sessionRetention.Milliseconds(), r.ID,
		"tenant", r.Tenant, "runtime", r.Runtime, "status", job.SessionStarting, "inc", 0, "created", ms(r.Created),
		"expires", ms(r.Expires), "idle_s", int64(r.IdleTimeout / time.Second), "mem", r.MemoryMB, "limits", string(limits),
		"restore", r.Restore, "seq", 0, "done", 0, "init", string(init), "fresh", "0", "network", network}
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
func (s *Store) Session(ctx context.Context, id string) (SessionRecord, error) {
	m, err := s.rdb.HGetAll(ctx, s.keys.session(id)).Result()
	if err != nil {
		return SessionRecord{}, fail("get session "+id, err)
	}
	if len(m) == 0 {
		return SessionRecord{}, fmt.Errorf("session %s: %w", id, ErrNotFound)
	}
	return parseSession(id, m)
}

// TenantSessions lists tenant's live sessions, oldest first.
func (s *Store) TenantSessions(ctx context.Context, tenant string, now time.Time) ([]SessionRecord, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, s.keys.tenantSessions(tenant), &redis.ZRangeBy{Min: "(" + strconv.FormatInt(ms(now), 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, fail("list sessions", err)
	}
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
	return out, nil
}

// claimSessionScript: KEYS[1] session; ARGV worker, instance, expected inc,
// status. Returns the new incarnation, -1 when the session has ended or is
// gone, -2 when its incarnation is not the expected one (another claim won).
var claimSessionScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'inc', 'status')
if not s[1] or s[2] == 'ended' then return -1 end
if s[1] ~= ARGV[3] then return -2 end
local inc = redis.call('HINCRBY', KEYS[1], 'inc', 1)
redis.call('HSET', KEYS[1], 'worker', ARGV[1], 'instance', ARGV[2], 'status', ARGV[4])
return inc
`)

// ClaimSession makes worker (process instance) the session's holder, from
// incarnation expect to expect+1, which it returns.
func (s *Store) ClaimSession(ctx context.Context, id, worker, instance string, expect int) (int, error) {
	n, err := claimSessionScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, worker, instance, expect, job.SessionStarting).Int()
	if err != nil {
		return 0, fail("claim session "+id, err)
	}
	switch n {
	case -1:
		return 0, fmt.Errorf("claim session %s: %w", id, ErrSessionEnded)
	case -2:
		return 0, fmt.Errorf("claim session %s: %w", id, ErrSessionFenced)
	}
	return n, nil
}

// fenceLua checks that ARGV[1..3] (worker, instance, inc) hold KEYS[1].
const fenceLua = `
local h = redis.call('HMGET', KEYS[1], 'worker', 'instance', 'inc', 'status')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] or h[3] ~= ARGV[3] then return {-1} end
if h[4] == 'ended' then return {-2} end
`

func fenced(op string, code int64) error {
	switch code {
	case -1:
		return fmt.Errorf("%s: %w", op, ErrSessionFenced)
	case -2:
		return fmt.Errorf("%s: %w", op, ErrSessionEnded)
	}
	return nil
}

// SessionHolder is the worker process and incarnation a change is made by.
type SessionHolder struct {
	Worker, Instance string
	Inc              int
}

func (h SessionHolder) args(more ...any) []any {
	return append([]any{h.Worker, h.Instance, h.Inc}, more...)
}

// readySessionScript: KEYS[1]; ARGV holder, image, digest, idle_until ms,
// fresh, note.
var readySessionScript = redis.NewScript(fenceLua + `
redis.call('HSET', KEYS[1], 'status', 'ready', 'image', ARGV[4], 'digest', ARGV[5], 'idle_until', ARGV[6], 'fresh', ARGV[7], 'note', ARGV[8])
return {1}
`)

// ReadySession marks the session served by h: its box is up.
func (s *Store) ReadySession(ctx context.Context, id string, h SessionHolder, img job.Image, idleUntil time.Time, fresh bool, note string) error {
	op := "ready session " + id
	res, err := readySessionScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, h.args(img.Name, img.Digest, ms(idleUntil), boolFlag(fresh), note)...).Int64Slice()
	if err != nil {
		return fail(op, err)
	}
	return fenced(op, res[0])
}

func boolFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Call states (NextCall).
const (
	CallRun         = 1 // the call is the caller's to run now
	CallInterrupted = 2 // the call had started under an incarnation that was lost
)

// nextCallScript: KEYS[1]; ARGV holder, now ms. Returns {0} when no call
// waits; {1, seq, spec} when the next call is now running under the
// holder; {2, seq} when it had started under an earlier holder (it is
// never run again); fence failures as fenceLua.
var nextCallScript = redis.NewScript(fenceLua + `
local s = redis.call('HMGET', KEYS[1], 'done', 'seq')
local nxt = tonumber(s[1]) + 1
if nxt > tonumber(s[2]) then return {0} end
local ck = KEYS[1] .. ':call:' .. nxt
local c = redis.call('HMGET', ck, 'state', 'spec', 'inc')
if c[1] == 'queued' then
  redis.call('HSET', ck, 'state', 'running', 'inc', ARGV[3], 'started', ARGV[4])
  return {1, nxt, c[2]}
end
return {2, nxt}
`)

// NextCall takes the session's next call for h, if one waits: state is 0
// (none), CallRun (spec is its SessionCall JSON) or CallInterrupted.
func (s *Store) NextCall(ctx context.Context, id string, h SessionHolder, now time.Time) (state int, seq int64, spec []byte, err error) {
	op := "next call of session " + id
	res, err := nextCallScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, h.args(ms(now))...).Slice()
	if err != nil {
		return 0, 0, nil, fail(op, err)
	}
	code := res[0].(int64)
	if err := fenced(op, code); err != nil {
		return 0, 0, nil, err
	}
	if code == 0 {
		return 0, 0, nil, nil
	}
	seq = res[1].(int64)
	if code == 1 {
		return CallRun, seq, []byte(res[2].(string)), nil
	}
	return CallInterrupted, seq, nil, nil
}

// finishCallScript: KEYS[1]; ARGV holder, seq, result JSON, idle_until ms,
// files JSON ("" unchanged), fresh, note.
var finishCallScript = redis.NewScript(fenceLua + `
local ck = KEYS[1] .. ':call:' .. ARGV[4]
redis.call('HSET', ck, 'state', 'done', 'result', ARGV[5])
redis.call('HSET', KEYS[1], 'done', ARGV[4], 'idle_until', ARGV[6], 'fresh', ARGV[8], 'note', ARGV[9])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'files', ARGV[7]) end
return {1}
`)

// FinishCall records call seq's result and the session's state after it:
// its idle deadline, its files' checkpoint (nil: unchanged), and whether
// the next call finds a fresh interpreter (fresh, note).
func (s *Store) FinishCall(ctx context.Context, id string, h SessionHolder, seq int64, res job.CallResult, idleUntil time.Time,
	files []job.SessionFileEntry, fresh bool, note string) error {
	op := fmt.Sprintf("finish call %d of session %s", seq, id)
	raw, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var fj []byte
	if files != nil {
		if fj, err = json.Marshal(files); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	out, err := finishCallScript.Run(ctx, s.rdb, []string{s.keys.session(id)},
		h.args(seq, string(raw), ms(idleUntil), string(fj), boolFlag(fresh), note)...).Int64Slice()
	if err != nil {
		return fail(op, err)
	}
	return fenced(op, out[0])
}

// bumpIncScript: KEYS[1]; ARGV holder. Returns {inc+1}.
var bumpIncScript = redis.NewScript(fenceLua + `
return {redis.call('HINCRBY', KEYS[1], 'inc', 1)}
`)

// BumpIncarnation moves h's session to its next incarnation (its
// interpreter starts anew) and returns it.
func (s *Store) BumpIncarnation(ctx context.Context, id string, h SessionHolder) (int, error) {
	op := "bump incarnation of session " + id
	out, err := bumpIncScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, h.args()...).Int64Slice()
	if err != nil {
		return 0, fail(op, err)
	}
	if err := fenced(op, out[0]); err != nil {
		return 0, err
	}
	return int(out[0]), nil
}

// enqueueCallScript: KEYS[1] session, KEYS[2] idempotency key (or ""
// with ARGV[6] "0"); ARGV tenant, spec, queue max, now ms, retention ms,
// has key, the spec's SHA-256. Returns {0, seq} (accepted), {1, seq} (the
// key's earlier call), {-1} (no such session of the tenant), {-2, reason}
// (ended), {-3} (full), {-4, seq} (the key's earlier call was another).
var enqueueCallScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'tenant', 'status', 'seq', 'done', 'expires', 'idle_until', 'ended_reason')
if not s[1] or s[1] ~= ARGV[1] then return {-1} end
if s[2] == 'ended' then return {-2, s[7]} end
local now = tonumber(ARGV[4])
local seq, done = tonumber(s[3]), tonumber(s[4])
if now >= tonumber(s[5]) then return {-2, 'max_lifetime'} end
if seq == done and s[6] and now >= tonumber(s[6]) then return {-2, 'idle_timeout'} end
if ARGV[6] == '1' then
  local got = redis.call('GET', KEYS[2])
  if got then
    local seq0, sum = string.match(got, '^(%d+):(.*)$')
    if sum ~= ARGV[7] then return {-4, tonumber(seq0)} end
    return {1, tonumber(seq0)}
  end
end
if seq - done >= tonumber(ARGV[3]) then return {-3} end
seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local ck = KEYS[1] .. ':call:' .. seq
local keep = tonumber(s[5]) + tonumber(ARGV[5])
redis.call('HSET', ck, 'state', 'queued', 'spec', ARGV[2], 'accepted', ARGV[4])
redis.call('PEXPIREAT', ck, keep)
if ARGV[6] == '1' then redis.call('SET', KEYS[2], seq .. ':' .. ARGV[7], 'PXAT', keep) end
return {0, seq}
`)

// CallByIdempotencyKey returns the seq of session id's call accepted with
// idemKey, if there is one.
func (s *Store) CallByIdempotencyKey(ctx context.Context, id, idemKey string) (int64, bool, error) {
	got, err := s.rdb.Get(ctx, s.keys.sessionIdem(id, idemKey)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fail("read the idempotency key of a call of session "+id, err)
	}
	seq, _, _ := strings.Cut(got, ":")
	n, err := strconv.ParseInt(seq, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("session %s: idempotency key record %q: %w", id, got, err)
	}
	return n, true, nil
}

// EnqueueCall accepts a call of tenant's session and returns its seq; with
// an idempotency key seen before, the seq of that call (dup true). Errors:
// ErrNotFound (no such session of the tenant), ErrSessionEnded (wrapped
// with the reason), ErrSessionQueueFull.
func (s *Store) EnqueueCall(ctx context.Context, tenant, id string, call job.SessionCall, idemKey string, queueMax int, now time.Time) (seq int64, dup bool, err error) {
	op := "enqueue a call of session " + id
	raw, err := json.Marshal(call)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", op, err)
	}
	ik, has := s.keys.session(id)+":idem:none", "0"
	if idemKey != "" {
		ik, has = s.keys.sessionIdem(id, idemKey), "1"
	}
	// The Idempotency-Key compares what the client sent: not the API's
	// reservation of the call's budget, made anew for every request.
	rawSent, err := json.Marshal(call.Sent())
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", op, err)
	}
	sum := sha256.Sum256(rawSent)
	res, err := enqueueCallScript.Run(ctx, s.rdb, []string{s.keys.session(id), ik}, tenant, string(raw), queueMax, ms(now),
		sessionRetention.Milliseconds(), has, hex.EncodeToString(sum[:])).Slice()
	if err != nil {
		return 0, false, fail(op, err)
	}
	switch res[0].(int64) {
	case -1:
		return 0, false, fmt.Errorf("%s: %w", op, ErrNotFound)
	case -2:
		reason, _ := res[1].(string)
		return 0, false, &SessionEndedError{Reason: reason}
	case -3:
		return 0, false, fmt.Errorf("%s: %w (%d calls)", op, ErrSessionQueueFull, queueMax)
	case -4:
		return res[1].(int64), false, fmt.Errorf("%s: %w (call %d)", op, ErrSessionKeyReused, res[1].(int64))
	case 1:
		return res[1].(int64), true, nil
	}
	return res[1].(int64), false, nil
}

// SessionEndedError says why a session is over; it wraps ErrSessionEnded.
type SessionEndedError struct{ Reason string }

func (e *SessionEndedError) Error() string { return "the session has ended: " + e.Reason }
func (e *SessionEndedError) Unwrap() error { return ErrSessionEnded }

// SessionCallRecord is a call's record.
type SessionCallRecord struct {
	State  string
	Spec   job.SessionCall
	Result *job.CallResult
	Inc    int
}

// SessionCall reads call seq of session id (ErrNotFound when none).
func (s *Store) SessionCall(ctx context.Context, id string, seq int64) (SessionCallRecord, error) {
	m, err := s.rdb.HGetAll(ctx, s.keys.sessionCall(id, seq)).Result()
	if err != nil {
		return SessionCallRecord{}, fail("get call", err)
	}
	if len(m) == 0 {
		return SessionCallRecord{}, fmt.Errorf("call %d of session %s: %w", seq, id, ErrNotFound)
	}
	c := SessionCallRecord{State: m["state"]}
	c.Inc, _ = strconv.Atoi(m["inc"])
	if err := json.Unmarshal([]byte(m["spec"]), &c.Spec); err != nil {
		return c, fmt.Errorf("call %d of session %s: spec: %w", seq, id, err)
	}
	if raw := m["result"]; raw != "" {
		c.Result = new(job.CallResult)
		if err := json.Unmarshal([]byte(raw), c.Result); err != nil {
			return c, fmt.Errorf("call %d of session %s: result: %w", seq, id, err)
		}
	}
	return c, nil
}

// endSessionScript: KEYS[1] session, KEYS[2] tenant's sessions; ARGV
// reason, id. Returns 1 when this ended it.
var endSessionScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'status')
if not st or st == 'ended' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'ended', 'ended_reason', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
`)

// EndSession ends a session for reason (idempotent).
func (s *Store) EndSession(ctx context.Context, id, tenant, reason string) (bool, error) {
	n, err := endSessionScript.Run(ctx, s.rdb, []string{s.keys.session(id), s.keys.tenantSessions(tenant)}, reason, id).Int()
	if err != nil {
		return false, fail("end session "+id, err)
	}
	return n == 1, nil
}

// WorkerInstance is the token of the process holding worker id's lease
// ("" when none does).
func (s *Store) WorkerInstance(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.keys.worker(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fail("worker instance "+id, err)
	}
	return v, nil
}
