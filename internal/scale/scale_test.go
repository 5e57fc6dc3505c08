package scale

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// runs records which jobs ran, how many times, and how many of each
// tenant's ran at once.
type runs struct {
	mu       sync.Mutex
	count    map[string]int
	started  map[string]time.Time
	running  map[string]int // by the code's tenant tag
	peak     map[string]int
	done     map[string]int // finished, by the code's tenant tag
	runFor   time.Duration
	finished atomic.Int64
}

func newRuns(runFor time.Duration) *runs {
	return &runs{count: map[string]int{}, started: map[string]time.Time{}, running: map[string]int{}, peak: map[string]int{}, done: map[string]int{}, runFor: runFor}
}

// tag is the tenant tag a job's code carries ("tenant-000001: print(1)").
func tag(code string) string { t, _, _ := strings.Cut(code, ":"); return t }

func (r *runs) run(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
	tg := tag(spec.Code)
	r.mu.Lock()
	r.count[id]++
	if _, ok := r.started[id]; !ok {
		r.started[id] = time.Now()
	}
	r.running[tg]++
	r.peak[tg] = max(r.peak[tg], r.running[tg])
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running[tg]--
		r.done[tg]++
		r.mu.Unlock()
		r.finished.Add(1)
	}()
	if r.runFor > 0 {
		select {
		case <-time.After(r.runFor):
		case <-ctx.Done():
			return job.Result{}, context.Cause(ctx)
		}
	}
	return testkit.Succeed(ctx, id, spec)
}

// submitAll submits one job for each tenant in tenants, 16 at a time, and
// returns their ids by tenant; every submission must be accepted.
func submitAll(t *testing.T, f *fleet, tenants []int, perTenant int) map[int][]string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	ids := map[int][]string{}
	var g errgroup.Group
	g.SetLimit(16)
	for _, i := range tenants {
		for k := range perTenant {
			g.Go(func() error {
				id, status, body := f.submit(client, i, tenantName(i)+": print("+strconv.Itoa(k)+")")
				if id == "" {
					t.Errorf("tenant %d's submission: %d %s", i, status, body)
					return nil
				}
				mu.Lock()
				ids[i] = append(ids[i], id)
				mu.Unlock()
				return nil
			})
		}
	}
	_ = g.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ids
}

// 10,000 tenants submit one job each through the API: every submission is
// accepted, every job succeeds once, and the queue's consumers are what
// they are with one tenant.
func TestTenThousandTenantsOneJobEach(t *testing.T) {
	t.Parallel()
	const n = 10_000
	f := startFleet(t, n, nil)
	r := newRuns(0)
	f.startWorker(t, "w1", 8, r.run)
	f.startWorker(t, "w2", 8, r.run)

	// One tenant first: the consumers a single tenant needs.
	one := submitAll(t, f, []int{0}, 1)
	waitFinished(t, r, 1, time.Minute)
	single := f.consumers(t)

	tenants := make([]int, 0, n-1)
	for i := 1; i < n; i++ {
		tenants = append(tenants, i)
	}
	began := time.Now()
	ids := submitAll(t, f, tenants, 1)
	waitFinished(t, r, n, 5*time.Minute)
	took := time.Since(began)
	ids[0] = one[0]
	for i, list := range ids {
		for _, id := range list {
			rec, err := f.store.GetJob(context.Background(), id)
			if err != nil || rec.Status != job.StatusSucceeded {
				t.Fatalf("tenant %d's job %s: %v %v", i, id, rec.Status, err)
			}
			r.mu.Lock()
			c := r.count[id]
			r.mu.Unlock()
			if c != 1 {
				t.Fatalf("tenant %d's job %s ran %d times", i, id, c)
			}
		}
	}
	after := f.consumers(t)
	if after[job.StreamName] != single[job.StreamName] || after[job.ReadyStreamName] != single[job.ReadyStreamName] {
		t.Fatalf("consumers after %d tenants %v; with one tenant %v", n, after, single)
	}
	t.Logf("%d tenants, one job each: %v (%.0f jobs/s); consumers %v, as with one tenant", n-1, took.Round(time.Millisecond), float64(n-1)/took.Seconds(), after)
}

// Fair turns at scale: among 1,000 tenants, one holds 5,000 queued jobs;
// another tenant's job starts within one job's run time per slot plus 2 s,
// not after the 5,000. A tenant's max_running holds across three workers.
func TestHeavyTenantDelaysOthersByAboutOneJobPerSlot(t *testing.T) {
	t.Parallel()
	const (
		n      = 1000
		heavy  = 0
		capped = 1
		probe  = n - 1
		runFor = 20 * time.Millisecond
		slots  = 2
	)
	f := startFleet(t, n, map[string]producer.Tenant{tenantName(capped): {Quota: producer.Quota{MaxRunning: 2}}})
	r := newRuns(runFor)
	for _, id := range []string{"w1", "w2", "w3"} {
		f.startWorker(t, id, slots, r.run)
	}
	// Every tenant but the probe has run a job: the fleet has seen them all.
	var others []int
	for i := 2; i < probe; i++ {
		others = append(others, i)
	}
	submitAll(t, f, others, 1)
	waitFinished(t, r, len(others), 2*time.Minute)
	base := int(r.finished.Load())

	submitAll(t, f, []int{heavy}, 5000)
	submitAll(t, f, []int{capped}, 20)
	// Once the heavy tenant's jobs are running, the probe's job comes.
	waitFinished(t, r, base+100, time.Minute)
	probeIDs := submitAll(t, f, []int{probe}, 1)
	submitted := time.Now()
	var started time.Time
	if !testkit.Poll(30*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		started = r.started[probeIDs[probe][0]]
		return !started.IsZero()
	}) {
		t.Fatal("the probe tenant's job never started")
	}
	wait := started.Sub(submitted)
	if bound := runFor + 2*time.Second; wait > bound {
		t.Fatalf("the probe's job waited %v behind a tenant with 5,000 queued jobs; want at most %v", wait, bound)
	}
	// The capped tenant's jobs take their turns beside the heavy tenant's
	// 5,000: its peak is judged once its 20 have run (the heavy tenant's
	// need not have).
	if !testkit.Poll(2*time.Minute, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.done[tenantName(capped)] >= 20
	}) {
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("%d of the capped tenant's 20 jobs finished within 2m", r.done[tenantName(capped)])
	}
	r.mu.Lock()
	peak := r.peak[tenantName(capped)]
	r.mu.Unlock()
	if peak > 2 || peak == 0 {
		t.Fatalf("the tenant with max_running 2 had %d jobs running at once across 3 workers", peak)
	}
	t.Logf("probe started %v after submission with 5,000 of another tenant's jobs queued; the capped tenant peaked at %d running", wait.Round(time.Millisecond), peak)
}

func waitFinished(t *testing.T, r *runs, n int, within time.Duration) {
	t.Helper()
	if !testkit.Poll(within, func() bool { return r.finished.Load() >= int64(n) }) {
		t.Fatalf("%d of %d jobs finished within %v", r.finished.Load(), n, within)
	}
}
