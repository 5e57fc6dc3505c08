package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// TestFairShareAcrossTenants: tenant A queues 200 jobs, then tenant B
// submits one. B's job must start within about one of A's job run times
// (the next slot to free up goes to B), not after A's backlog.
func TestFairShareAcrossTenants(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		APIKeys: map[string]string{"key-a": "tenant-a", "key-b": "tenant-b"}, RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	a, _ := client.New(hs.URL, client.WithAPIKey("key-a"))
	b, _ := client.New(hs.URL, client.WithAPIKey("key-b"))
	const slots = 2
	e.startWorker(t, "e2e-fair", slots)

	const backlog = 200
	var aIDs []string
	for start := 0; start < backlog; start += 100 {
		specs := make([]job.Spec, 100)
		for i := range specs {
			specs[i] = py("import time\ntime.sleep(0.5)\nprint(%d)", start+i)
			specs[i].Cache = job.CacheOff()
		}
		items, err := a.Batch(ctx, specs)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Err != nil || it.Submission == nil {
				t.Fatalf("tenant A's job %d: %v", it.Index, it.Err)
			}
			aIDs = append(aIDs, it.Submission.ID)
		}
	}
	// A's backlog is running: every slot busy, ~198 of A's jobs waiting.
	e.waitRecord(t, aIDs[1], time.Minute, func(r cache.Record) bool { return r.Status != job.StatusQueued })
	e.waitRecord(t, aIDs[0], time.Minute, func(r cache.Record) bool { return r.Status != job.StatusQueued })

	submitted := time.Now()
	bSpec := py("print('b')")
	bSpec.Cache = job.CacheOff()
	sub, err := b.Submit(ctx, bSpec)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.waitRecord(t, sub.ID, time.Minute, func(r cache.Record) bool { return r.StartedAt != nil })
	waited := rec.StartedAt.Sub(submitted)

	// One of A's job run times, as the worker saw it: start to finish of
	// the longest of A's jobs that ended so far.
	var runTime time.Duration
	done := 0
	for _, id := range aIDs {
		r, err := e.store.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Terminal() && r.StartedAt != nil && r.FinishedAt != nil {
			done++
			runTime = max(runTime, r.FinishedAt.Sub(*r.StartedAt))
		}
	}
	t.Logf("B's job started %v after submission; %d of A's %d jobs had ended; A's longest run %v", waited, done, backlog, runTime)
	if done >= backlog/2 {
		t.Fatalf("%d of A's jobs ended before B's started: no fair share", done)
	}
	// One run time per slot, plus the worker's pick (a few requests) and
	// B's own sandbox start, generously.
	if bound := runTime + 2*time.Second; waited > bound {
		t.Fatalf("B's job waited %v; the bound is one of A's run times (%v) + 2s", waited, runTime)
	}
}
