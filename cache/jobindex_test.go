package cache

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// tenantMessage is newMessage of tenant with metadata md.
func tenantMessage(t *testing.T, tenant string, md job.Metadata) job.Message {
	t.Helper()
	m := newMessage(t)
	m.Tenant, m.Spec.Metadata = tenant, md
	return m
}

// listAll reads every page of q, checking that pages do not overlap.
func listAll(t *testing.T, s *Store, q JobQuery) []string {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	for pages := 0; ; pages++ {
		recs, next, err := s.ListJobs(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if seen[r.Message.ID] {
				t.Fatalf("job %s listed twice", r.Message.ID)
			}
			seen[r.Message.ID] = true
			ids = append(ids, r.Message.ID)
		}
		if next == "" {
			return ids
		}
		if pages > 100 {
			t.Fatal("no end of pages")
		}
		q.Cursor = next
	}
}

// A tenant's jobs are listed newest first, a page at a time, and another
// tenant's never.
func TestListJobsPagesNewestFirst(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	var mine []string
	for i := range 25 {
		m := tenantMessage(t, "alice", nil)
		if err := s.CreateJob(ctx, m); err != nil {
			t.Fatal(err)
		}
		mine = append(mine, m.ID)
		if i%5 == 0 {
			if err := s.CreateJob(ctx, tenantMessage(t, "bob", nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	slices.Reverse(mine)
	recs, next, err := s.ListJobs(ctx, JobQuery{Tenant: "alice", Limit: 10})
	if err != nil || len(recs) != 10 || next != recs[9].Message.ID {
		t.Fatalf("first page: %d jobs, next %q, %v", len(recs), next, err)
	}
	if got := listAll(t, s, JobQuery{Tenant: "alice", Limit: 10}); !slices.Equal(got, mine) {
		t.Fatalf("alice's jobs listed %v\nwant newest first %v", got, mine)
	}
	if got := listAll(t, s, JobQuery{Tenant: "bob", Limit: 100}); len(got) != 5 {
		t.Fatalf("bob's jobs: %d, want 5", len(got))
	}
	if got := listAll(t, s, JobQuery{Tenant: "carol", Limit: 10}); len(got) != 0 {
		t.Fatalf("carol has no jobs; listed %v", got)
	}
}

// The status sets follow every change of status the scripts make, and a
// cache hit's record enters the index with its metadata.
func TestListJobsFilters(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	create := func(md job.Metadata) string {
		m := tenantMessage(t, "alice", md)
		if err := s.CreateUnpublishedJob(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	queued := create(job.Metadata{"team": "a"})
	running := create(job.Metadata{"team": "b"})
	succeeded := create(job.Metadata{"team": "a", "run": "7"})
	failed := create(nil)
	canceled := create(job.Metadata{"team": "a"})
	deleted := create(job.Metadata{"team": "a"})
	for _, id := range []string{running, succeeded, failed} {
		if _, err := s.MarkRunningLeased(ctx, id, "w1", 1, time.Time{}, Lease{Token: "w1/1"}); err != nil {
			t.Fatal(err)
		}
	}
	for id, st := range map[string]job.Status{succeeded: job.StatusSucceeded, failed: job.StatusFailed} {
		if _, err := s.Finish(ctx, id, job.Result{Status: st, ExitCode: job.IntPtr(0)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Cancel(ctx, canceled); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJob(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	hitMsg := tenantMessage(t, "alice", job.Metadata{"team": "a"})
	if err := s.CreateAlias(ctx, hitMsg, job.Result{ID: hitMsg.ID, Status: job.StatusSucceeded, CacheHit: true}); err != nil {
		t.Fatal(err)
	}
	hit := hitMsg.ID
	// Hits of an entry this process knows: one through the transaction
	// (CreateHitOfKnown), one through its script (CreateAliasOfKnown).
	key := job.CodeSHA256("indexed hit")
	if err := s.StoreResult(ctx, key, sampleResult(job.StatusSucceeded, nil)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LookupResult(ctx, key); err != nil {
		t.Fatal(err)
	}
	known, _ := s.KnownResult(key)
	knownHit := tenantMessage(t, "alice", job.Metadata{"team": "b"})
	knownHit.Key = key
	if ok, err := s.CreateHitOfKnown(ctx, known, knownHit); !ok || err != nil {
		t.Fatalf("CreateHitOfKnown = %v, %v", ok, err)
	}
	knownAlias := tenantMessage(t, "alice", job.Metadata{"team": "b"})
	knownAlias.Key = key
	if ok, err := s.CreateAliasOfKnown(ctx, known, knownAlias); !ok || err != nil {
		t.Fatalf("CreateAliasOfKnown = %v, %v", ok, err)
	}

	for _, c := range []struct {
		q    JobQuery
		want []string // newest first
	}{
		{JobQuery{}, []string{knownAlias.ID, knownHit.ID, hit, canceled, failed, succeeded, running, queued}},
		{JobQuery{Tags: job.Metadata{"team": "b"}, Status: job.StatusSucceeded}, []string{knownAlias.ID, knownHit.ID}},
		{JobQuery{Status: job.StatusQueued}, []string{queued}},
		{JobQuery{Status: job.StatusRunning}, []string{running}},
		{JobQuery{Status: job.StatusSucceeded}, []string{knownAlias.ID, knownHit.ID, hit, succeeded}},
		{JobQuery{Status: job.StatusFailed}, []string{failed}},
		{JobQuery{Status: job.StatusCanceled}, []string{canceled}},
		{JobQuery{Tags: job.Metadata{"team": "a"}}, []string{hit, canceled, succeeded, queued}},
		{JobQuery{Tags: job.Metadata{"team": "a", "run": "7"}}, []string{succeeded}},
		{JobQuery{Tags: job.Metadata{"team": "a"}, Status: job.StatusSucceeded}, []string{hit, succeeded}},
		{JobQuery{Tags: job.Metadata{"team": "c"}}, nil},
		{JobQuery{Tags: job.Metadata{"team": "a"}, Status: job.StatusFailed}, nil},
	} {
		c.q.Tenant, c.q.Limit = "alice", 2
		if got := listAll(t, s, c.q); !slices.Equal(got, c.want) {
			t.Errorf("%+v: listed %v, want %v", c.q, got, c.want)
		}
	}
	// The ids of a deleted job left the index with it.
	for _, k := range []string{s.keys.jobIndex("alice"), jobStatusIndex(s.keys.jobIndex("alice"), job.StatusQueued)} {
		if n, err := s.rdb.ZScore(ctx, k, deleted).Result(); err == nil {
			t.Errorf("%s still holds the deleted job (%v)", k, n)
		}
	}
}

// Creation time bounds are bounds on ids; a job older than the records'
// retention leaves the index with the next job indexed, and the index
// expires with the records.
func TestJobIndexTimeBoundsAndRetention(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{JobTTL: time.Hour})
	ctx := context.Background()
	now := time.Now()
	// Ids as job.NewID makes them, at chosen times.
	at := func(t0 time.Time) string {
		return idTimePrefix(t0) + fmt.Sprintf("-7%03x-8000-%012x", t0.Nanosecond()%4096, t0.UnixNano()&0xffffffffffff)
	}
	old := job.Message{ID: at(now.Add(-2 * time.Hour)), Spec: job.Spec{Runtime: "python", Code: "1"}, CreatedAt: now.Add(-2 * time.Hour), Tenant: "alice"}
	ten := job.Message{ID: at(now.Add(-10 * time.Minute)), Spec: job.Spec{Runtime: "python", Code: "2"}, CreatedAt: now.Add(-10 * time.Minute), Tenant: "alice"}
	if !job.ValidID(old.ID) || !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7`).MatchString(old.ID) {
		t.Fatalf("made id %q", old.ID)
	}
	if err := s.CreateJob(ctx, old); err != nil {
		t.Fatal(err)
	}
	// Its record is still there (the test wrote it now), so only the
	// trim can take its id out.
	fresh := tenantMessage(t, "alice", nil)
	for _, m := range []job.Message{ten, fresh} {
		if err := s.CreateJob(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if got := listAll(t, s, JobQuery{Tenant: "alice", Limit: 10}); !slices.Equal(got, []string{fresh.ID, ten.ID}) {
		t.Errorf("listed %v; want the two jobs within the retention", got)
	}
	if got := listAll(t, s, JobQuery{Tenant: "alice", Limit: 10, After: now.Add(-time.Minute)}); !slices.Equal(got, []string{fresh.ID}) {
		t.Errorf("after a minute ago: %v", got)
	}
	if got := listAll(t, s, JobQuery{Tenant: "alice", Limit: 10, Before: now.Add(-time.Minute)}); !slices.Equal(got, []string{ten.ID}) {
		t.Errorf("before a minute ago: %v", got)
	}
	if got := listAll(t, s, JobQuery{Tenant: "alice", Limit: 10, After: now.Add(-time.Minute), Before: now.Add(-2 * time.Minute)}); len(got) != 0 {
		t.Errorf("an empty range: %v", got)
	}
	for _, k := range []string{s.keys.jobIndex("alice"), jobStatusIndex(s.keys.jobIndex("alice"), job.StatusQueued)} {
		ttl, err := s.rdb.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > time.Hour {
			t.Errorf("%s: TTL %v (%v); want the records' (an hour)", k, ttl, err)
		}
	}
}

// A page reads about as many records as it shows, however many jobs the
// tenant has: Redis counts the HGETALLs.
func TestListJobsReadsAPage(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	for i := range 500 {
		md := job.Metadata{"n": strconv.Itoa(i % 10)}
		if err := s.CreateJob(ctx, tenantMessage(t, "alice", md)); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []JobQuery{
		{Tenant: "alice", Limit: 10},
		{Tenant: "alice", Limit: 10, Tags: job.Metadata{"n": "3"}},
		{Tenant: "alice", Limit: 10, Status: job.StatusQueued},
	} {
		if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		recs, next, err := s.ListJobs(ctx, q)
		if err != nil || len(recs) != 10 || next == "" {
			t.Fatalf("%+v: %d jobs, next %q, %v", q, len(recs), next, err)
		}
		stats, err := s.rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`cmdstat_hgetall:calls=(\d+)`).FindStringSubmatch(stats)
		if m == nil {
			t.Fatalf("no hgetall in %s", stats)
		}
		if n, _ := strconv.Atoi(m[1]); n > 11 {
			t.Errorf("%+v: a page of 10 read %d records", q, n)
		}
	}
}
