package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// A session's holder: the worker process serving it, fenced by the
// session's incarnation. Each change a worker makes names the incarnation
// it holds (SessionHolder); one that lost the session to another worker is
// refused with ErrSessionFenced.

// claimSessionScript: KEYS[1] session; ARGV worker, instance, expected inc,
// status. Returns the new incarnation, -1 when the session has ended or is
// gone, -2 when its incarnation is not the expected one (another claim won),
// -3 when it is paused (Resume comes first, which counts it again).
var claimSessionScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'inc', 'status')
if not s[1] or s[2] == 'ended' then return -1 end
if s[2] == 'paused' then return -3 end
if s[1] ~= ARGV[3] then return -2 end
local inc = redis.call('HINCRBY', KEYS[1], 'inc', 1)
redis.call('HSET', KEYS[1], 'worker', ARGV[1], 'instance', ARGV[2], 'status', ARGV[4])
return inc
`)

// ClaimSession makes worker (process instance) the session's holder, from
// incarnation expect to expect+1, which it returns.
func (s *Sessions) ClaimSession(ctx context.Context, id, worker, instance string, expect int) (int, error) {
	n, err := claimSessionScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, worker, instance, expect, job.SessionStarting).Int()
	if err != nil {
		return 0, fail("claim session "+id, err)
	}
	switch n {
	case -1:
		return 0, fmt.Errorf("claim session %s: %w", id, ErrSessionEnded)
	case -2:
		return 0, fmt.Errorf("claim session %s: %w", id, ErrSessionFenced)
	case -3:
		return 0, fmt.Errorf("claim session %s: %w", id, ErrSessionPaused)
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
// fresh, note, restored ("": not a resume).
var readySessionScript = redis.NewScript(fenceLua + `
redis.call('HSET', KEYS[1], 'status', 'ready', 'image', ARGV[4], 'digest', ARGV[5], 'idle_until', ARGV[6], 'fresh', ARGV[7], 'note', ARGV[8], 'resumed', '0')
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'restored', ARGV[9]) end
return {1}
`)

// ReadySession marks the session served by h: its box is up. restored,
// for a session resumed from a pause, says what came back.
func (s *Sessions) ReadySession(ctx context.Context, id string, h SessionHolder, img job.Image, idleUntil time.Time, fresh bool, note, restored string) error {
	op := "ready session " + id
	res, err := readySessionScript.Run(ctx, s.rdb, []string{s.keys.session(id)}, h.args(img.Name, img.Digest, ms(idleUntil), boolFlag(fresh), note, restored)...).Int64Slice()
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
	CallWithdrawn   = 3 // the call was withdrawn before it started (WithdrawCall)
)

// nextCallScript: KEYS[1]; ARGV holder, now ms. Returns {0} when no call
// waits; {1, seq, spec} when the next call is now running under the
// holder; {2, seq} when it had started under an earlier holder (it is
// never run again); {3, seq} when it was withdrawn before it started;
// fence failures as fenceLua.
//
// A call already running under the holder's own incarnation is handed to
// it again ({1, seq, spec}): the holder asks for its next call only once
// the one before is recorded, so such a call is one it took but never
// learnt it had (the reply was lost: a read timeout, a dropped
// connection, the server killed after the write). The script is then
// safe to repeat, as the client's own retry of it (Config's max_retries)
// and the worker's next ask assume; the call still runs once.
var nextCallScript = redis.NewScript(fenceLua + `
local s = redis.call('HMGET', KEYS[1], 'done', 'seq')
local nxt = tonumber(s[1]) + 1
if nxt > tonumber(s[2]) then return {0} end
local ck = KEYS[1] .. ':call:' .. nxt
local c = redis.call('HMGET', ck, 'state', 'spec', 'inc')
if c[1] == 'queued' or (c[1] == 'running' and c[3] == ARGV[3]) then
  redis.call('HSET', ck, 'state', 'running', 'inc', ARGV[3], 'started', ARGV[4])
  return {1, nxt, c[2]}
end
if c[1] == 'withdrawn' then return {3, nxt} end
return {2, nxt}
`)

// NextCall takes the session's next call for h, if one waits: state is 0
// (none), CallRun (spec is its SessionCall JSON), CallInterrupted or
// CallWithdrawn.
func (s *Sessions) NextCall(ctx context.Context, id string, h SessionHolder, now time.Time) (state int, seq int64, spec []byte, err error) {
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
	switch code {
	case 1:
		return CallRun, seq, []byte(res[2].(string)), nil
	case 3:
		return CallWithdrawn, seq, nil, nil
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
func (s *Sessions) FinishCall(ctx context.Context, id string, h SessionHolder, seq int64, res job.CallResult, idleUntil time.Time,
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
func (s *Sessions) BumpIncarnation(ctx context.Context, id string, h SessionHolder) (int, error) {
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
