package worker

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// submitAs records and publishes a job of tenant the way the API does.
func (b *bundle) submitAs(t *testing.T, tenant, code string, mod ...func(*job.Message)) string {
	t.Helper()
	return b.submitBounded(t, tenant, code, 0, mod...)
}

// submitBounded is submitAs with the tenant's running-jobs bound (0: none).
func (b *bundle) submitBounded(t *testing.T, tenant, code string, maxRunning int, mod ...func(*job.Message)) string {
	t.Helper()
	ctx := context.Background()
	spec := job.Spec{Runtime: "python", Code: code, Limits: job.DefaultLimits, Cache: job.CacheOff()}
	m := job.Message{ID: job.NewID(), Spec: spec, CreatedAt: time.Now(), Tenant: tenant, CacheScope: "tenant:" + tenant}
	for _, f := range mod {
		f(&m)
	}
	m.Key = m.CacheKey("sha256:test")
	if err := b.store.CreateJob(ctx, m); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(m)
	subject := job.TenantJobSubject("python", tenant)
	h := nats.Header{job.HeaderMsgID: []string{m.ID}, job.HeaderJobID: []string{m.ID}}
	if maxRunning > 0 {
		h.Set(job.HeaderMaxRunning, strconv.Itoa(maxRunning))
	}
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: h}); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Publish(job.WorkSubject("python"), []byte(subject)); err != nil {
		t.Fatal(err)
	}
	return m.ID
}

// TestTenantsTakeTurns: with one slot, tenant B's single job, submitted
// after 30 of tenant A's, runs as soon as the slot frees, not 30th; and the
// CPU time of every job is charged to its tenant.
func TestTenantsTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var mu sync.Mutex
	var order []string
	started := make(chan struct{}, 64)
	// A's first job holds the one slot until B's job is queued.
	bQueued := make(chan struct{})
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		mu.Lock()
		order = append(order, id)
		first := len(order) == 1
		mu.Unlock()
		started <- struct{}{}
		if first {
			select {
			case <-bQueued:
			case <-ctx.Done():
			}
		}
		res, err := testkit.Succeed(ctx, id, spec)
		res.CPUMS = 40
		return res, err
	}}
	var aIDs []string
	for i := range 30 {
		aIDs = append(aIDs, b.submitAs(t, "tenant-a", "print("+string(rune('a'+i%26))+")"))
	}
	b.start(t, rt, func(c *Config) { c.Concurrency = 1 })
	testkit.Receive(t, started, 10*time.Second, "A's first job") // it holds the one slot
	bID := b.submitAs(t, "tenant-b", "print('b')")
	close(bQueued)
	b.waitTerminal(t, bID, 10*time.Second)
	mu.Lock()
	pos := -1
	for i, id := range order {
		if id == bID {
			pos = i
		}
	}
	mu.Unlock()
	if pos < 0 || pos > 2 {
		t.Fatalf("tenant B's job ran at position %d of %d; want within the next turn (position 1 or 2)", pos, len(order))
	}
	b.waitTerminal(t, aIDs[len(aIDs)-1], 20*time.Second)
	used, err := b.store.CPUUsed(context.Background(), "tenant-b", time.Now())
	if err != nil || used != 40*time.Millisecond {
		t.Fatalf("tenant B's CPU time today: %v %v, want 40ms", used, err)
	}
	if used, _ := b.store.CPUUsed(context.Background(), "tenant-a", time.Now()); used != 30*40*time.Millisecond {
		t.Fatalf("tenant A's CPU time today: %v, want %v", used, 30*40*time.Millisecond)
	}
}

// TestBoundTenantsNextJobIsTakenWhenItsJobEnds: a tenant at its
// running-jobs bound (1) with a job queued is dropped from the worker's
// listing of subjects holding jobs: the free slot's fetch finds nothing to
// deliver (JetStream holds a no-wait fetch for a second while the bound
// stands, and the first job runs longer). As the running job ends, the
// worker lists its subject again, so the queued job is taken by the slot
// that job freed. The worker's clock stands still here, so its listing never
// ages out: without that, the second job would never be taken.
func TestBoundTenantsNextJobIsTakenWhenItsJobEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	first := b.submitBounded(t, "tenant-bound", "print(1)", 1)
	second := b.submitBounded(t, "tenant-bound", "print(2)", 1)
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		if id == first {
			// Outlasts the second slot's fetch (its second), so that
			// fetch ends empty and the subject is dropped.
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		return testkit.Succeed(ctx, id, spec)
	}}
	b.start(t, rt, func(c *Config) { c.Clock = testkit.NewClock(time.Now()) })
	for _, id := range []string{first, second} {
		if rec := b.waitTerminal(t, id, 20*time.Second); rec.Status != job.StatusSucceeded {
			t.Fatalf("job %s: %s", id, rec.Status)
		}
	}
}

// TestWakeRescansAJobTheQueueShowedLate: a job's wake-up can come before
// its tenant's consumer knows of it (a no-wait fetch then answers "no
// messages"); the source scans again soon after instead of waiting for its
// idle poll, here an hour: without the rescans the job would not be taken
// before the test's deadline.
func TestWakeRescansAJobTheQueueShowedLate(t *testing.T) {
	t.Parallel()
	scans := make(chan int, 16)
	n := 0
	src := &jobSource{wake: make(chan struct{}, 1), idle: time.Hour}
	src.scanOnce = func(context.Context) (jetstream.Msg, error) {
		n++
		scans <- n
		if n < 3 { // before the job, and once right after its wake-up
			return nil, nil
		}
		return lateMsg{}, nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make(chan jetstream.Msg, 1)
	go func() {
		m, _ := src.next(ctx, time.Hour)
		got <- m
	}()
	if first := <-scans; first != 1 {
		t.Fatalf("scan %d first", first)
	}
	src.wake <- struct{}{} // the job's wake-up, which the next scan misses
	if m := <-got; m == nil {
		t.Fatalf("no job taken after %d scans: the source waited for its idle poll after a wake-up whose job the queue showed late", len(scans)+1)
	}
	if n != 3 {
		t.Errorf("%d scans; want 3 (before the job, after its wake-up, one rescan)", n)
	}
}

// lateMsg stands for a job message; the test never reads it.
type lateMsg struct{ jetstream.Msg }
