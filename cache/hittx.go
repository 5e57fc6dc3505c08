package cache

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// CreateHitOfKnown records msg as a cache hit of known's entry, as
// CreateAliasOfKnown does, for a submission whose id was made for it and
// is known to no one else yet (no Idempotency-Key names it), so no other
// request can read or write its record meanwhile. Then no script is
// needed: a transaction reads the entry and writes the record (holding the
// entry as this process remembers it) with its TTL, and the entry read
// tells whether the hit stands. Lua costs Redis more per hit than the
// commands themselves (it hashes every string it is handed, the 1 KiB
// entry twice; docs/benchmarks.md), and cache hits are the API's fastest,
// most frequent answer. The hits of concurrent submissions go to Redis as
// one pipeline holding one transaction, which reads each entry they name
// once (sendHits).
//
// When the entry is gone or has changed, the record is removed, the entry
// forgotten, and false returned; the caller then reads the entry with
// LookupResult. On false or an error msg.ID is spent: its record may hold
// what the entry no longer holds (a removal that failed, a transaction
// whose answer was lost), so the caller goes on under a new id.
func (s *Store) CreateHitOfKnown(ctx context.Context, known *KnownResult, msg job.Message) (bool, error) {
	op := "create cache-hit record " + msg.ID
	rawMsg, err := known.hitArgs(op, &msg)
	if err != nil {
		return false, err
	}
	key := s.keys.job(msg.ID)
	c := &hitCall{ctx: ctx, entry: s.keys.result(known.Key),
		hset: redis.NewStatusCmd(ctx, "hset", key, fieldMsg, rawMsg, fieldStatus, string(known.Result.Status), fieldResult, known.raw,
			fieldFinishedAt, formatTime(msg.CreatedAt), fieldAttempt, "0", fieldCacheHit, "1"),
		expire: redis.NewStatusCmd(ctx, "pexpire", key, s.jobTTL)}
	s.knownHits.run(c)
	if c.err != nil {
		return false, fail(op, c.err)
	}
	if entry, _ := c.read.(string); entry != known.raw {
		s.known.forget(known.Key, known)
		if err := s.rdb.Del(context.WithoutCancel(ctx), key).Err(); err != nil {
			return false, fail(op+": remove the record of a changed entry", err)
		}
		return false, nil
	}
	return true, nil
}

// hitCall is one hit for sendHits: the entry to read, the record's
// commands (queued in the transaction), and the outcome: the entry read,
// or the error.
type hitCall struct {
	ctx          context.Context
	entry        string
	hset, expire *redis.StatusCmd
	read         any
	err          error
}

// sendHits sends calls as one pipeline: MULTI, a GET of each entry the
// calls name (once each), every call's HSET and PEXPIRE, EXEC. The
// transaction makes each call's read and write one step, as each call's
// own transaction would. The pipeline is not canceled with any one
// caller's ctx; it is bounded by the Store's read and write timeouts.
func (s *Store) sendHits(calls []*hitCall) {
	ctx := context.WithoutCancel(calls[0].ctx)
	cmds := make([]redis.Cmder, 0, 3+3*len(calls))
	cmds = append(cmds, redis.NewStatusCmd(ctx, "multi"))
	reads := make(map[string]int, 1) // entry → its GET's place in EXEC's answer
	at := make([]int, 2*len(calls))  // each call's GET's place, then its HSET's
	n := 0                           // commands in the transaction
	for i, c := range calls {
		g, ok := reads[c.entry]
		if !ok {
			g, reads[c.entry] = n, n
			cmds = append(cmds, redis.NewStatusCmd(ctx, "get", c.entry))
			n++
		}
		at[2*i], at[2*i+1] = g, n
		cmds = append(cmds, c.hset, c.expire)
		n += 2
	}
	exec := redis.NewSliceCmd(ctx, "exec")
	cmds = append(cmds, exec)
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, cmd := range cmds {
			_ = p.Process(ctx, cmd)
		}
		return nil
	})
	replies, err := exec.Result()
	if err == nil && len(replies) != n {
		err = fmt.Errorf("the transaction answered %d replies, want %d", len(replies), n)
	}
	for i, c := range calls {
		if c.err = err; err != nil {
			continue
		}
		// A command that failed in the transaction (a key of another
		// type) is answered as an error in its place.
		w := at[2*i+1]
		for _, v := range []any{replies[at[2*i]], replies[w], replies[w+1]} {
			if e, ok := v.(error); ok && c.err == nil {
				c.err = e
			}
		}
		c.read = replies[at[2*i]]
	}
}
