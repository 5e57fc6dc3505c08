package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// Pausing a session frees its sandbox and keeps its files: the API asks
// (RequestPause), the holder checkpoints and lets the box go (PauseHeld),
// and the session waits, out of its tenant's live sessions, until a call
// or POST .../resume brings it back (Resume) on any worker with room.

// ErrSessionPaused: the session is paused; Resume it before a worker
// claims it.
var ErrSessionPaused = errors.New("the session is paused")

// requestPauseScript: KEYS[1] session; ARGV tenant. Returns 1 (asked), 2
// (paused already), -1 (no such session of the tenant), -2 (ended, with
// its reason).
var requestPauseScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'status', 'tenant', 'ended_reason')
if not s[1] or s[2] ~= ARGV[1] then return {-1} end
if s[1] == 'ended' then return {-2, s[3]} end
if s[1] == 'paused' then return {2} end
redis.call('HSET', KEYS[1], 'pause', '1')
return {1}
`)

// RequestPause asks the holder of tenant's session id to pause it; paused
// is true when it is paused already. ErrNotFound when the tenant has no
// such session; a *SessionEndedError when it has ended.
func (s *Sessions) RequestPause(ctx context.Context, tenant, id string) (paused bool, err error) {
	op := "pause session " + id
	res, err := requestPauseScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, tenant).Slice()
	if err != nil {
		return false, fail(op, err)
	}
	switch res[0].(int64) {
	case -1:
		return false, fmt.Errorf("%s: %w", op, ErrNotFound)
	case -2:
		reason, _ := res[1].(string)
		return false, &SessionEndedError{Reason: reason}
	case 2:
		return true, nil
	}
	return false, nil
}

// pauseHeldScript: KEYS[1] session, KEYS[2] tenant's live sessions,
// KEYS[3] its paused ones; ARGV holder, now ms, id.
var pauseHeldScript = redis.NewScript(fenceLua + `
redis.call('HSET', KEYS[1], 'status', 'paused', 'worker', '', 'instance', '', 'pause', '0', 'paused_at', ARGV[4])
local expires = redis.call('HGET', KEYS[1], 'expires')
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[3], expires, ARGV[5])
redis.call('PEXPIREAT', KEYS[3], tonumber(expires) + ` + sessionRetentionLua + `)
return {1}
`)

// sessionRetentionLua is sessionRetention in a script, in milliseconds.
var sessionRetentionLua = fmt.Sprint(sessionRetention.Milliseconds())

// PauseHeld records that h paused tenant's session id at now: its box is
// going, its files are in the last checkpoint, and it no longer counts
// among the tenant's live sessions.
func (s *Sessions) PauseHeld(ctx context.Context, tenant, id string, h SessionHolder, now time.Time) error {
	op := "pause session " + id
	out, err := pauseHeldScript.Run(ctx, s.rdb, []string{s.keys.session(id), s.keys.tenantSessions(tenant), s.keys.tenantPausedSessions(tenant)},
		h.args(ms(now), id)...).Int64Slice()
	if err != nil {
		return fail(op, err)
	}
	return fenced(op, out[0])
}

// resumeScript: KEYS[1] session, KEYS[2] tenant's live sessions, KEYS[3]
// its paused ones; ARGV tenant, now ms, max live sessions, id. Returns 1
// (resumed: a worker may claim it), 0 (it was not paused), -1 (no such
// session of the tenant), -2 (ended, with its reason), -3 (the tenant has
// as many live sessions as allowed).
var resumeScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'status', 'tenant', 'ended_reason', 'expires')
if not s[1] or s[2] ~= ARGV[1] then return {-1} end
if s[1] == 'ended' then return {-2, s[3]} end
if s[1] ~= 'paused' then return {0} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return {-3} end
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('ZADD', KEYS[2], s[4], ARGV[4])
redis.call('HSET', KEYS[1], 'status', 'moving', 'resumed', '1')
return {1}
`)

// Resume makes tenant's paused session id one of its live sessions again,
// to be claimed by a worker; resumed is false when it was not paused.
// ErrSessionQuota when the tenant has maxLive live sessions already.
func (s *Sessions) Resume(ctx context.Context, tenant, id string, maxLive int, now time.Time) (resumed bool, err error) {
	op := "resume session " + id
	res, err := resumeScript.Run(ctx, s.rdb, []string{s.keys.session(id), s.keys.tenantSessions(tenant), s.keys.tenantPausedSessions(tenant)},
		tenant, ms(now), maxLive, id).Slice()
	if err != nil {
		return false, fail(op, err)
	}
	switch res[0].(int64) {
	case -1:
		return false, fmt.Errorf("%s: %w", op, ErrNotFound)
	case -2:
		reason, _ := res[1].(string)
		return false, &SessionEndedError{Reason: reason}
	case -3:
		return false, fmt.Errorf("%s: %w (at most %d per tenant)", op, ErrSessionQuota, maxLive)
	case 1:
		return true, nil
	}
	return false, nil
}

// setFilesScript: KEYS[1]; ARGV holder, files JSON.
var setFilesScript = redis.NewScript(fenceLua + `
redis.call('HSET', KEYS[1], 'files', ARGV[4])
return {1}
`)

// SetSessionFiles records the checkpoint of h's session taken outside a
// call (before a pause).
func (s *Sessions) SetSessionFiles(ctx context.Context, id string, h SessionHolder, files []job.SessionFileEntry) error {
	op := "checkpoint session " + id
	raw, err := json.Marshal(files)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	out, err := setFilesScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, h.args(string(raw))...).Int64Slice()
	if err != nil {
		return fail(op, err)
	}
	return fenced(op, out[0])
}
