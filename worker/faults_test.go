package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// Redis restarted without its data while the worker held a job: the job's
// record is gone, so no write of the held job can succeed and clear the
// pause. The PING probe must resume pulls, and the worker must recreate the
// lost record from the message and run the job instead of dropping it.
func TestStoreBackEmptyResumesAndRestoresRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	rt := &scriptedRuntime{run: succeed}
	b.start(t, rt, func(c *Config) {
		c.Heartbeat = 300 * time.Millisecond
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
	})
	waitFor(t, 10*time.Second, func() bool { return b.waiting(t) > 0 })
	held := b.record(t, "print('held')")
	b.redis.Stop()
	b.publish(t, held)
	waitFor(t, 10*time.Second, func() bool { a, _ := b.pending(t); return a == 1 })
	b.redis.RestartEmpty()
	rec := b.waitTerminal(t, held.ID, 10*time.Second)
	if rec.Status != job.StatusSucceeded {
		t.Fatalf("held job after an empty restart: %+v", rec)
	}
	// A job published after the restart (its record lost as well: written
	// before the restart, so the worker must restore it) runs within seconds.
	lost := b.record(t, "print('lost')")
	b.redis.RestartEmpty()
	start := time.Now()
	b.publish(t, lost)
	rec = b.waitTerminal(t, lost.ID, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Message.Spec.Code != "print('lost')" {
		t.Fatalf("job whose record was lost: %+v", rec)
	}
	t.Logf("job with a lost record ran %v after publish", time.Since(start).Round(time.Millisecond))
	if n := rt.calls.Load(); n != 2 {
		t.Fatalf("runtime called %d times, want 2", n)
	}
}

// A second worker started with the id of a live worker refuses to start,
// naming the problem, and leaves the first one's id lease alone.
func TestSecondWorkerWithLiveIDRefusesToStart(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	b.start(t, &scriptedRuntime{run: succeed}, func(c *Config) { c.ID = "same"; c.IDLease = time.Second })
	waitFor(t, 10*time.Second, func() bool { return b.waiting(t) > 0 })
	w, err := New(Config{ID: "same", Runtime: &scriptedRuntime{run: succeed}, Store: b.store, NATS: b.nc, Queue: b.q, IDLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = w.Run(ctx)
	if !errors.Is(err, cache.ErrWorkerIDInUse) || !strings.Contains(err.Error(), "distinct --id") {
		t.Fatalf("second worker with a live id: %v", err)
	}
	if alive, err := b.store.WorkerAlive(ctx, "same"); err != nil || !alive {
		t.Fatalf("first worker's id lease: alive=%v %v", alive, err)
	}
	id := b.submit(t, "print(1)")
	if rec := b.waitTerminal(t, id, 10*time.Second); rec.Status != job.StatusSucceeded || rec.Result.Worker != "same" {
		t.Fatalf("first worker after the refused start: %+v", rec)
	}
}
