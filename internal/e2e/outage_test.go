package e2e

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// submitRetrying submits like a well-behaved client: on 429/503 it waits and tries again.
func submitRetrying(ctx context.Context, c *client.Client, spec job.Spec) (string, int, error) {
	retries := 0
	for {
		sub, err := c.Submit(ctx, spec)
		var ce *client.Error
		if errors.As(err, &ce) && ce.Temporary() {
			retries++
			select {
			case <-ctx.Done():
				return "", retries, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return "", retries, err
		}
		return sub.ID, retries, nil
	}
}

// natsOutage is how long the NATS outages below last: longer than AckWait,
// so JetStream (whose timers run on real time) redelivers what it lost
// heartbeats for.
var natsOutage = testQueue.AckWait + time.Second

// Acceptance 4: the NATS server restarts (same store directory) during a load
// of 500 jobs: every accepted job reaches a terminal state, none runs twice.
// The server stays down longer than AckWait while long jobs run, so JetStream
// redelivers jobs whose heartbeats it lost; the lease in the store must keep
// those duplicates from running.
func TestNATSRestartDuringLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test; skipped with -short")
	}
	e := setup(t)
	e.startWorker(t, "e2e-restart-a", 2)
	e.startWorker(t, "e2e-restart-b", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const total, clients = 500, 10
	ids := make([]string, total)
	var retried sync.Map
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < total; i += clients {
				spec := py("print(%d)", i)
				if i%10 == 0 { // long enough to span the outage
					spec = py("import time\ntime.sleep(3)\nprint(%d)", i)
				}
				id, n, err := submitRetrying(ctx, e.api, spec)
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
				ids[i] = id
				if n > 0 {
					retried.Store(i, n)
				}
			}
		}()
	}
	// Once the load is under way (long jobs among those running), stop NATS
	// under it.
	testkit.Eventually(t, 2*time.Minute, "40 jobs to run", func() bool { return e.runs.total.Load() >= 40 })
	e.nats.Stop()
	// The outage must outlast AckWait, as the server's own clock sees it.
	time.Sleep(natsOutage)
	e.nats.Start()
	wg.Wait()
	nRetried := 0
	retried.Range(func(any, any) bool { nRetried++; return true })
	for i, id := range ids {
		v, err := e.api.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d (%s): %v", i, id, err)
		}
		if v.Status != job.StatusSucceeded || v.Stdout != strconv.Itoa(i)+"\n" {
			t.Errorf("job %d: %s %q %+v", i, v.Status, v.Stdout, v.Error)
		}
		switch n := e.runs.of(id); {
		case n == 0:
			t.Errorf("job %d finished without running", i)
		case n > 1:
			t.Errorf("job %d ran %d times", i, n)
		}
	}
	t.Logf("500 jobs across a NATS restart: all succeeded, none lost, none run twice; %d submissions retried after 503; %d lease polls refused (duplicate deliveries held while their first run went on)",
		nRetried, e.held.Load())
}

// Acceptance 5: Redis unavailable: the API answers 503 with a clear message,
// workers hold their jobs, and everything finishes once Redis is back.
func TestRedisOutage(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-redis", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ids []string
	for i := range 4 {
		id, _, err := submitRetrying(ctx, e.api, py("import time\ntime.sleep(1)\nprint(%d)", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	e.redis.Stop()
	_, err := e.api.Submit(ctx, py("print('while down')"))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 503 || !strings.Contains(ce.Detail+ce.Title, "Redis") || ce.RetryAfter <= 0 {
		t.Fatalf("submit with Redis down: %v (%+v)", err, ce)
	}
	// The outage lasts two AckWaits of the server's clock: held jobs must
	// not be redelivered or lost.
	time.Sleep(2 * testQueue.AckWait)
	e.redis.Start()
	for i, id := range ids {
		v, err := e.api.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		if v.Status != job.StatusSucceeded || v.Stdout != strconv.Itoa(i)+"\n" {
			t.Fatalf("job %d after the outage: %+v", i, v.Result)
		}
		if n := e.runs.of(id); n != 1 {
			t.Errorf("job %d ran %d times", i, n)
		}
	}
}

// A job running while the NATS server is down for longer than AckWait is
// redelivered to another worker after the restart (the server never got its
// heartbeats). The lease in the store makes that delivery wait instead of
// running the job a second time.
func TestRedeliveryAfterNATSOutageIsHeld(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-held-a", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py("import time\ntime.sleep(8)\nprint('once')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	// A second worker with a free slot, ready to take any redelivery.
	e.startWorker(t, "e2e-held-b", 1)
	// Worker b runs (it holds its id's lease), ready to take any redelivery.
	testkit.Eventually(t, 30*time.Second, "worker b to hold its id", func() bool {
		inst, _ := e.store.WorkerInstance(ctx, "e2e-held-b")
		return inst != ""
	})
	e.nats.Stop()
	time.Sleep(natsOutage) // the outage must outlast AckWait, as the server's own clock sees it
	e.nats.Start()
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Stdout != "once\n" || v.Attempt != 1 || v.Worker != "e2e-held-a" {
		t.Fatalf("result %+v", v.Result)
	}
	if n := e.runs.of(sub.ID); n != 1 {
		t.Fatalf("job ran %d times, want 1", n)
	}
	// The outage must really have caused a redelivery, or this test proved nothing.
	if n := e.held.Load(); n == 0 {
		t.Fatal("no delivery was held by the lease: the outage caused no redelivery while the job ran")
	} else {
		t.Logf("lease polls refused while the first run went on: %d", n)
	}
}
