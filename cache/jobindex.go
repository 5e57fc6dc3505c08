package cache

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// The job index: what GET /v1/jobs lists. Per tenant, a sorted set of its
// jobs' ids (keys.go's jobIndex), one per status (jobStatusIndex) and one
// per metadata pair (jobTagIndex). Every member has score 0, so a set
// sorts by member, and a job id is a UUIDv7, whose text sorts by its
// creation time to the millisecond: a page is one ZRANGE ... BYLEX REV
// LIMIT from a cursor (the last id shown), O(log n + page) whatever the
// tenant's number of jobs, and a creation time bound is a bound on ids.
//
// The scripts that create a job add it to its tenant's set, its status's
// and its metadata's; the scripts that change its status move it between
// status sets. Every add trims the set of ids older than JobTTL (the
// records' retention) and renews the set's TTL, so a set holds about the
// jobs whose records still exist and goes with its tenant's last record.
// An id whose record is gone before that (a job rolled back, a cache hit
// whose entry changed) is dropped when a listing reads it.

// JobQuery is a listing of one tenant's jobs (ListJobs).
type JobQuery struct {
	Tenant string
	// Status, when set, lists only jobs of that status.
	Status job.Status
	// Tags lists only jobs whose metadata holds every pair.
	Tags job.Metadata
	// After and Before, when set, bound the jobs' creation times
	// (exclusive, to the millisecond).
	After, Before time.Time
	// Cursor, when set, lists jobs older than that id (a page's
	// NextCursor).
	Cursor string
	// Limit bounds the page (1 .. job.ListPageMax).
	Limit int
}

// scanBudget is how many ids a page reads at most, for a limit: a query
// with one filter (or none) reads one set that holds only matches; with
// more than one, the others are checked on the records, and a page may end
// short of its limit, with a cursor, once this many were read.
func scanBudget(limit int) int { return 5*limit + 20 }

// ListJobs returns a page of q.Tenant's jobs matching q, newest first, and
// the cursor of the next page ("" when there is none).
func (s *Jobs) ListJobs(ctx context.Context, q JobQuery) ([]*Record, string, error) {
	op := "list jobs"
	limit := min(max(q.Limit, 1), job.ListPageMax)
	set, err := s.smallestSet(ctx, q)
	if err != nil {
		return nil, "", fail(op, err)
	}
	hi := "+"
	if !q.Before.IsZero() {
		hi = "(" + idTimePrefix(q.Before)
	}
	if q.Cursor != "" && (hi == "+" || q.Cursor < hi[1:]) {
		hi = "(" + q.Cursor
	}
	lo := "-"
	if !q.After.IsZero() {
		lo = "[" + idTimePrefix(q.After.Add(time.Millisecond))
	}
	var out []*Record
	var gone []any
	defer func() {
		if len(gone) > 0 {
			// Best effort: a later listing drops them again.
			_ = s.rdb.ZRem(context.WithoutCancel(ctx), set, gone...).Err()
		}
	}()
	for scanned, budget := 0, scanBudget(limit); ; {
		ids, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: set, Start: hi, Stop: lo, ByLex: true, Rev: true,
			Offset: 0, Count: int64(min(limit+1, budget-scanned))}).Result()
		if err != nil {
			return nil, "", fail(op, err)
		}
		if len(ids) == 0 {
			return out, "", nil
		}
		recs, err := s.GetJobs(ctx, ids)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", op, err)
		}
		for i, r := range recs {
			scanned++
			switch {
			case r == nil:
				gone = append(gone, ids[i])
			case !q.matches(r):
			case len(out) == limit:
				// One more match: the page is full and there is a next.
				return out, out[limit-1].Message.ID, nil
			default:
				out = append(out, r)
			}
		}
		last := ids[len(ids)-1]
		if scanned >= budget {
			return out, last, nil
		}
		hi = "(" + last
	}
}

// matches reports whether r is a job q lists (its set holds ids only;
// what the set does not say is checked here, and the tenant again).
func (q JobQuery) matches(r *Record) bool {
	return r.Message.TenantOrDefault() == q.Tenant &&
		(q.Status == "" || r.Status == q.Status) &&
		job.Metadata(r.Message.Spec.Metadata).Matches(q.Tags)
}

// smallestSet is the set a listing reads: of the sets q's filters name
// (its status's, its tags'), the one holding fewest ids; the tenant's
// whole index without filters.
func (s *Jobs) smallestSet(ctx context.Context, q JobQuery) (string, error) {
	base := s.keys.jobIndex(q.Tenant)
	var sets []string
	if q.Status != "" {
		sets = append(sets, jobStatusIndex(base, q.Status))
	}
	for k, v := range q.Tags {
		sets = append(sets, jobTagIndex(base, k, v))
	}
	switch len(sets) {
	case 0:
		return base, nil
	case 1:
		return sets[0], nil
	}
	slices.Sort(sets) // the same choice for the same query when sizes tie
	cards := make([]*redis.IntCmd, len(sets))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range sets {
			cards[i] = p.ZCard(ctx, k)
		}
		return nil
	}); err != nil {
		return "", err
	}
	best := 0
	for i := range sets {
		if cards[i].Val() < cards[best].Val() {
			best = i
		}
	}
	return sets[best], nil
}

// jobIndex is what writing a job does to its tenant's job index: the sets
// it enters and the bound below which a set's ids are past the records'
// retention. The job records' scripts (Jobs) and the cache-hit records
// (Results) both write through it.
type jobIndex struct{ *conn }

// sets are the job index sets a job of msg enters with status st:
// its tenant's, its status's and one per metadata pair.
func (s jobIndex) sets(msg job.Message, st job.Status) []string {
	base := s.keys.jobIndex(msg.TenantOrDefault())
	sets := make([]string, 0, 2+len(msg.Spec.Metadata))
	sets = append(sets, base, jobStatusIndex(base, st))
	for k, v := range msg.Spec.Metadata {
		sets = append(sets, jobTagIndex(base, k, v))
	}
	return sets
}

// cmds are sets as commands of a transaction (hittx.go), each
// set's as indexLua's index_add: ZADD, trim, PEXPIRE.
func (s jobIndex) cmds(ctx context.Context, msg job.Message, st job.Status) []redis.Cmder {
	sets := s.sets(msg, st)
	bound := s.bound()
	cmds := make([]redis.Cmder, 0, 3*len(sets))
	for _, k := range sets {
		cmds = append(cmds, redis.NewStatusCmd(ctx, "zadd", k, 0, msg.ID),
			redis.NewStatusCmd(ctx, "zremrangebylex", k, "-", bound),
			redis.NewStatusCmd(ctx, "pexpire", k, s.jobTTL))
	}
	return cmds
}

// bound is the exclusive lex bound below which an index set's ids are
// older than the records' retention: ids made over JobTTL ago.
func (s jobIndex) bound() string {
	return "(" + idTimePrefix(time.Now().Add(-time.Duration(s.jobTTL)*time.Millisecond))
}

// idTimePrefix is the text a UUIDv7 made at t starts with (its 48-bit
// unix millisecond time, as job.NewID writes it): every id made before t's
// millisecond sorts below it, every id made at or after it above.
func idTimePrefix(t time.Time) string {
	ms := max(t.UnixMilli(), 0)
	return fmt.Sprintf("%08x-%04x", ms>>16, ms&0xffff)
}
