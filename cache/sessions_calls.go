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

// A session's calls: accepted in order (EnqueueCall), each at most once per
// Idempotency-Key, and read back with their results (SessionCall).

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
func (s *Sessions) CallByIdempotencyKey(ctx context.Context, id, idemKey string) (int64, bool, error) {
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
func (s *Sessions) EnqueueCall(ctx context.Context, tenant, id string, call job.SessionCall, idemKey string, queueMax int, now time.Time) (seq int64, dup bool, err error) {
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

// withdrawCallScript: KEYS[1] the call's key. Returns 1 when the call was
// queued and is now withdrawn, else 0.
var withdrawCallScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'withdrawn')
return 1
`)

// WithdrawCall withdraws call seq of session id if it is still queued: its
// holder answers it canceled instead of running it (NextCall's
// CallWithdrawn). It reports whether the call was withdrawn; one that has
// started, ended or was withdrawn before is left as it is.
func (s *Sessions) WithdrawCall(ctx context.Context, id string, seq int64) (bool, error) {
	n, err := withdrawCallScript.Run(ctx, s.rdb, []string{s.keys.sessionCall(id, seq)}).Int()
	if err != nil {
		return false, fail(fmt.Sprintf("withdraw call %d of session %s", seq, id), err)
	}
	return n == 1, nil
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
func (s *Sessions) SessionCall(ctx context.Context, id string, seq int64) (SessionCallRecord, error) {
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
