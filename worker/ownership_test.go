package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Owners of the sandboxes the fake runtimes below report on this host.
const (
	ownerGone = "w-gone" // holds no lease: its worker is dead
	ownerLive = "w-live" // holds a live lease: alive, cut off from the queue
)

// verdicts is what one pass of a reaper decided: keep or not, by owner,
// and the worker's clock when the pass began.
type verdicts struct {
	at   time.Time
	keep map[string]bool
}

// sweepRuntime reports a sandbox of each of owners on this host at every
// sweep (Sandboxes.ReapExpired) and tells the test what the worker would keep.
type sweepRuntime struct {
	testkit.Runtime
	clock  *testkit.Clock
	owners []string
	passes chan verdicts
}

func (r *sweepRuntime) ReapExpired(_ context.Context, keep func(string) bool) ([]string, error) {
	v := verdicts{at: r.clock.Now(), keep: map[string]bool{}} // read first: keep reads the clock after
	var reaped []string
	for _, o := range r.owners {
		if v.keep[o] = keep(o); !v.keep[o] {
			reaped = append(reaped, "sandbox-of-"+o)
		}
	}
	select {
	case r.passes <- v:
	default: // the test is not listening
	}
	return reaped, nil
}

// Mirror of internal/e2e's orphan tests at the sweep: the worker keeps its
// own sandboxes and those of a worker whose id lease is live, and removes
// those of a worker without a lease only once the lease has been missing
// for a whole IDLease on the worker's clock (a live worker re-takes a lease
// the store lost within IDLease/3).
func TestSweepRemovesSandboxesOfWorkersGoneForAnIDLease(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	if err := b.store.AcquireWorker(context.Background(), ownerLive, "its-process", time.Minute); err != nil {
		t.Fatal(err)
	}
	clock := testkit.NewClock(time.Time{})
	start := clock.Now()
	const self = "w-sweeper"
	rt := &sweepRuntime{Runtime: testkit.Runtime{Script: testkit.Succeed}, clock: clock,
		owners: []string{self, ownerLive, ownerGone, ""}, passes: make(chan verdicts, 64)}
	b.start(t, rt, func(c *Config) {
		c.ID = self
		c.IDLease = time.Second
		c.SweepInterval = 10 * time.Millisecond
		c.Clock = clock
	})

	after := func(at time.Time, what string) verdicts {
		t.Helper()
		return testkit.ReceiveMatching(t, rt.passes, 10*time.Second, what, func(v verdicts) bool { return !v.at.Before(at) })
	}
	v := after(start, "a sweep")
	if !v.keep[self] || !v.keep[ownerLive] || !v.keep[ownerGone] || !v.keep[""] {
		t.Fatalf("first sweep keeps %v; want everything (the lease has just been found missing)", v.keep)
	}
	clock.Advance(time.Second - time.Millisecond)
	if v := after(clock.Now(), "a sweep just within IDLease"); !v.keep[ownerGone] {
		t.Fatalf("sweep %v after the lease went missing removed its sandbox: %v", v.at.Sub(start), v.keep)
	}
	clock.Advance(time.Millisecond)
	v = after(clock.Now(), "a sweep an IDLease on")
	if v.keep[ownerGone] || !v.keep[self] || !v.keep[ownerLive] || !v.keep[""] {
		t.Fatalf("sweep an IDLease after the lease went missing keeps %v; want all but %s's", v.keep, ownerGone)
	}
}

// jobReapRuntime reports, for a redelivered job, a sandbox of each of
// owners on this host (Sandboxes.ReapJob); the first call of Run wedges until
// release, as a run whose worker went silent.
type jobReapRuntime struct {
	testkit.Runtime
	owners []string
	passes chan verdicts
}

func (r *jobReapRuntime) ReapJob(_ context.Context, jobID string, keep func(string) bool) ([]string, error) {
	v := verdicts{keep: map[string]bool{"job:" + jobID: true}}
	var reaped []string
	for _, o := range r.owners {
		if v.keep[o] = keep(o); !v.keep[o] {
			reaped = append(reaped, "sandbox-of-"+o)
		}
	}
	select {
	case r.passes <- v:
	default:
	}
	return reaped, nil
}

// Mirror of internal/e2e.TestKilledWorkersSandboxEndsBeforeRedelivery at
// the worker: a job whose first attempt went silent (no heartbeat, its
// lease lapsed) is redelivered; the second attempt takes the job once the
// lease lapses, and before it runs, the job's sandboxes on this host are
// judged: a dead worker's removed, a live worker's kept (after waiting
// IDLease for its lease to lapse), its own live attempt's kept. The job is
// recorded once, by the attempt that ran it.
func TestRedeliveryReapsTheDeadAttemptsSandbox(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second, MaxDeliver: 3})
	if err := b.store.AcquireWorker(context.Background(), ownerLive, "its-process", time.Minute); err != nil {
		t.Fatal(err)
	}
	const self = "w-redelivered"
	release := make(chan struct{})
	var once sync.Once
	unwedge := func() { once.Do(func() { close(release) }) }
	rt := &jobReapRuntime{owners: []string{self, ownerLive, ownerGone}, passes: make(chan verdicts, 8)}
	var calls sync.Mutex
	first := true
	rt.Script = func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		calls.Lock()
		wedge := first
		first = false
		calls.Unlock()
		if wedge {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return testkit.Succeed(ctx, id, spec)
	}
	sig := newSignals()
	b.start(t, rt, func(c *Config) {
		c.ID = self
		c.Concurrency = 2
		c.Heartbeat = time.Hour // the first attempt goes silent
		c.IDLease = 300 * time.Millisecond
		c.DrainTimeout = time.Second
		c.Hooks = sig.hooks()
	})
	t.Cleanup(unwedge) // before the worker's stop
	id := b.submit(t, "print(1)")
	of(t, sig.claimed, id, 10*time.Second, "the first attempt's claim")
	if e := of(t, sig.claimed, id, 10*time.Second, "the redelivery's claim"); e.Attempt < 2 {
		t.Fatalf("claimed again by attempt %d, want a redelivery", e.Attempt)
	}
	v := testkit.Receive(t, rt.passes, 10*time.Second, "the redelivered job's sandboxes judged")
	if !v.keep["job:"+id] || v.keep[ownerGone] || !v.keep[ownerLive] || !v.keep[self] {
		t.Fatalf("judged %v; want the job's, %s's removed, %s's and the live attempt's kept", v.keep, ownerGone, ownerLive)
	}
	rec := b.waitTerminal(t, id, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt < 2 {
		t.Fatalf("record %s attempt %d; want succeeded by a redelivery", rec.Status, rec.Result.Attempt)
	}
	if n := rt.Calls.Load(); n != 2 {
		t.Fatalf("runtime called %d times, want 2 (the silent attempt and the one that took over)", n)
	}
	unwedge()
	if e := testkit.ReceiveMatching(t, sig.recorded, 10*time.Second, "the silent attempt's late write", func(e Event) bool {
		return e.JobID == id && e.Attempt == 1
	}); e.Won {
		t.Fatal("the silent attempt's late result replaced the redelivery's")
	}
}
