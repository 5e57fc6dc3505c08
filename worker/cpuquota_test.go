package worker

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Issue 23, acceptance 5 (at the worker): a tenant with 3 CPU-seconds a
// day submits a batch of five jobs whose CPU limit is 1 s and which each
// use all of it, on a worker with two slots. Each run reserves its limit
// as it starts, so runs start only while the quota covers them: three run
// (3 s charged, the quota exactly), the other two end at once as a
// non-retryable quota_exceeded failure naming the quota, run once, never
// an internal error. Another tenant's job runs meanwhile.
func TestCPUQuotaReservedAtRunStart(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var mu sync.Mutex
	ran := map[string]bool{}
	// The first run lasts until a second one starts beside it, so the two
	// slots' runs overlap: a charge made only when a run ends would let a
	// run start that the quota no longer covers.
	second := make(chan struct{})
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		mu.Lock()
		ran[id] = true
		n := len(ran)
		mu.Unlock()
		switch n {
		case 1:
			select {
			case <-second:
			case <-ctx.Done():
			}
		case 2:
			close(second)
		}
		res, err := testkit.Succeed(ctx, id, spec)
		res.CPUMS = spec.Limits.CPUMS // used its whole limit
		return res, err
	}}
	quota := func(m *job.Message) {
		m.Spec.Limits.CPUMS = 1000
		m.Quota = &job.TenantQuota{CPUSecondsPerDay: 3}
	}
	var ids []string
	for range 5 {
		ids = append(ids, b.submitAs(t, "frugal", "work()", quota))
	}
	other := b.submitAs(t, "other", "work()", quota)
	b.start(t, rt, func(c *Config) { c.Concurrency = 2 })

	runs, refused := 0, 0
	for _, id := range append(ids, other) {
		rec := b.waitTerminal(t, id, 10*time.Second)
		r := rec.Result
		switch {
		case r.Status == job.StatusSucceeded:
			runs++
		case r.Status == job.StatusFailed && r.Error != nil && r.Error.Category == job.CategoryQuota:
			refused++
			mu.Lock()
			didRun := ran[id]
			mu.Unlock()
			if r.Error.Retryable || !strings.Contains(r.Error.Message, string(job.QuotaCPUDay)) || r.Attempt != 1 || didRun {
				t.Errorf("refused job %s: %+v (attempt %d, ran %v); want a non-retryable failure naming %s, first attempt, not run", id, r.Error, r.Attempt, didRun, job.QuotaCPUDay)
			}
			if id == other {
				t.Errorf("the other tenant's job was refused: %s", r.Error.Message)
			}
		default:
			t.Errorf("job %s: %s %+v", id, r.Status, r.Error)
		}
	}
	used, err := b.store.CPUUsed(context.Background(), "frugal", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("frugal: %d of 5 jobs ran, %v of CPU charged against a 3 s quota", runs-1, used)
	if used > 3*time.Second || runs-1 != 3 || refused != 2 {
		t.Fatalf("%d of frugal's jobs ran using %v, %d refused; want 3 runs within the 3 s quota, 2 refused", runs-1, used, refused)
	}
	// Settled: nothing stays reserved once the runs are recorded.
	if r, err := b.store.ReserveCPU(context.Background(), "other", "probe", 2*time.Second, 3*time.Second, time.Minute, time.Now()); err != nil || !r.OK || r.Reserved != 0 {
		t.Fatalf("the other tenant after its run: %+v %v; want 1 s used, nothing reserved", r, err)
	}
}
