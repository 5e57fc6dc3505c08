package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// CreateHitOfKnown records msg as a cache hit of known's entry, as
// CreateAliasOfKnown does, for a submission whose id was made for it and
// is known to no one else yet (no Idempotency-Key names it), so no other
// request can read or write its record meanwhile. Then no script is
// needed: a transaction reads the entry and writes the record with its
// TTL, and the entry read tells whether the hit stands. Lua costs Redis
// more per hit than the commands themselves (it hashes every string it is
// handed, the 1 KiB entry twice; docs/benchmarks.md), and cache hits are
// the API's fastest, most frequent answer.
//
// The record does not hold a copy of the entry: it names the entry's
// hit-result copy (keys.go), one per distinct stored form, which the same
// transaction makes if it is missing, and keeps at least JobTTL past the
// newest record naming it. A replaced entry's old records keep reading
// the old copy. Redis then writes, keeps and rewrites about a third of
// what a copy per record costs (docs/benchmarks.md). GetJob and GetJobs
// read the copy back, so the record reads as one holding the entry.
//
// The hits of concurrent submissions go to Redis as one pipeline holding
// one transaction, which reads and copies each entry they name once
// (sendHits).
//
// When the entry is gone or has changed, the record is removed, the entry
// forgotten, and false returned; the caller then reads the entry with
// LookupResult. On false or an error msg.ID is spent: its record may name
// what the entry no longer holds (a removal that failed, a transaction
// whose answer was lost), so the caller goes on under a new id.
func (s *Results) CreateHitOfKnown(ctx context.Context, known *KnownResult, msg job.Message) (bool, error) {
	op := "create cache-hit record " + msg.ID
	rawMsg, err := known.hitArgs(op, &msg)
	if err != nil {
		return false, err
	}
	key := s.keys.job(msg.ID)
	c := &hitCall{ctx: ctx, known: known,
		hset: redis.NewStatusCmd(ctx, "hset", key, fieldMsg, rawMsg, fieldStatus, string(known.Result.Status),
			fieldResultCopy, known.copyID, fieldFinishedAt, formatTime(msg.CreatedAt), fieldAttempt, "0", fieldCacheHit, "1",
			fieldIndex, s.keys.jobIndex(msg.TenantOrDefault())),
		expire: redis.NewStatusCmd(ctx, "pexpire", key, s.jobTTL),
		index:  s.index.cmds(ctx, msg, known.Result.Status)}
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

const (
	// copySlack is how far past JobTTL a transaction sets a hit-result
	// copy's TTL.
	copySlack = time.Hour
	// copyRefresh is how often this process sets a copy's TTL again while
	// it records hits naming it. A record made within copyRefresh of the
	// last setting expires before the copy does: copyRefresh < copySlack.
	copyRefresh = 10 * time.Minute
)

// hitCall is one hit for sendHits: the entry, the record's commands
// (queued in the transaction), and the outcome: the entry read, or the
// error.
type hitCall struct {
	ctx          context.Context
	known        *KnownResult
	hset, expire *redis.StatusCmd
	// index are the commands that put the job in its tenant's job index
	// (indexCmds).
	index []redis.Cmder
	read  any
	err   error
}

// sendHits sends calls as one pipeline holding one transaction: MULTI;
// for each entry the calls name (once each), a GET of it, a SET of its
// hit-result copy if missing and, when this process last set the copy's
// TTL over copyRefresh ago, a PEXPIRE of it; every call's HSET, PEXPIRE
// and job index commands; EXEC. The transaction makes each call's read and writes one
// step, as each call's own would. The pipeline is not canceled with any
// one caller's ctx; it is bounded by the client's read and write timeouts.
func (s *Results) sendHits(calls []*hitCall) {
	ctx := context.WithoutCancel(calls[0].ctx)
	sent := s.since()
	cmds := make([]redis.Cmder, 0, 5+4*len(calls))
	cmds = append(cmds, redis.NewStatusCmd(ctx, "multi"))
	reads := make(map[*KnownResult]int, 1) // entry → its GET's place in EXEC's answer
	var refreshed []*KnownResult
	at := make([]int, 2*len(calls)) // each call's GET's place, then its HSET's (its PEXPIRE and index commands follow)
	n := 0                          // commands in the transaction
	for i, c := range calls {
		k := c.known
		g, ok := reads[k]
		if !ok {
			g, reads[k] = n, n
			copyKey, ttl := s.keys.hitResult(k.copyID), s.jobTTL+copySlack.Milliseconds()
			cmds = append(cmds, redis.NewStatusCmd(ctx, "get", s.keys.result(k.Key)),
				redis.NewStatusCmd(ctx, "set", copyKey, k.raw, "nx", "px", ttl))
			n += 2
			if last := k.copyAt.Load(); last == 0 || time.Duration(sent-last) > copyRefresh {
				cmds = append(cmds, redis.NewStatusCmd(ctx, "pexpire", copyKey, ttl))
				refreshed = append(refreshed, k)
				n++
			}
		}
		at[2*i], at[2*i+1] = g, n
		cmds = append(cmds, c.hset, c.expire)
		cmds = append(cmds, c.index...)
		n += 2 + len(c.index)
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
	if err == nil {
		for _, k := range refreshed {
			k.copyAt.Store(sent)
		}
	}
	for i, c := range calls {
		if c.err = err; err != nil {
			continue
		}
		// A command that failed in the transaction (a key of another
		// type) is answered as an error in its place.
		g, w := at[2*i], at[2*i+1]
		for _, v := range append([]any{replies[g], replies[g+1]}, replies[w:w+2+len(c.index)]...) {
			if e, ok := v.(error); ok && c.err == nil {
				c.err = e
			}
		}
		c.read = replies[g]
	}
}

// since is the time since the Results were made, on the monotonic clock, in
// nanoseconds (never 0 once a transaction is sent).
func (s *Results) since() int64 { return max(int64(time.Since(s.epoch)), 1) }

// readCopies puts in each of records (HGETALL answers) that names a
// hit-result copy instead of holding its result the copy's stored form, as
// a record holding it would read: one MGET for all of them.
func (s *Jobs) readCopies(ctx context.Context, records ...map[string]string) error {
	var keys []string
	var named []map[string]string
	for _, h := range records {
		if id := h[fieldResultCopy]; id != "" && h[fieldResult] == "" {
			keys = append(keys, s.keys.hitResult(id))
			named = append(named, h)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return fail("read cache-hit result copies", err)
	}
	for i, h := range named {
		v, ok := vals[i].(string)
		if !ok {
			// Made with the record and kept longer: only data lost from
			// Redis can take it.
			return fmt.Errorf("cache-hit record names result copy %s, which is gone", h[fieldResultCopy])
		}
		h[fieldResult] = v
	}
	return nil
}
