package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/worker"
)

// The outage tests below stop the NATS server (embedded, same store
// directory across the restart) or Redis under an in-process API and
// workers. Their runs are scripted: these tests are about the queue, the
// leases and the store, and an outage is a length of time, not a signal.

// outageQueue redelivers quickly, so an outage that outlasts AckWait takes
// seconds.
var outageQueue = queue.Config{AckWait: 2 * time.Second, MaxDeliver: 3}

// natsOutage is how long the NATS outages last: longer than AckWait, so
// JetStream (whose timers run on real time) redelivers what it lost
// heartbeats for.
var natsOutage = outageQueue.AckWait + time.Second

// outageEnv is one test's Redis, NATS, API and workers.
type outageEnv struct {
	redis  *testenv.Redis
	nats   *testenv.NATS
	store  *cache.Store
	nc     *nats.Conn
	api    *client.Client
	apiURL string
	runs   *scriptedRuns
	held   atomic.Int64 // MarkRunningLeased calls refused by a live lease (polls, not jobs)
}

func startOutageEnv(t *testing.T) *outageEnv {
	t.Helper()
	ctx := context.Background()
	e := &outageEnv{redis: testenv.StartRedis(t), nats: testenv.StartNATS(t), runs: &scriptedRuns{n: map[string]int{}}}
	var err error
	if e.store, err = cache.New(ctx, cache.Config{URL: e.redis.URL()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	if e.nc, err = nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: outageQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	e.apiURL = hs.URL
	if e.api, err = client.New(hs.URL); err != nil {
		t.Fatal(err)
	}
	return e
}

// startWorker runs an in-process worker on the scripted runtime. It returns
// once the worker registered its runtime: its queue is set up and it pulls.
func (e *outageEnv) startWorker(t *testing.T, id string, concurrency int) {
	t.Helper()
	e.startWorkerOn(t, e.nc, id, concurrency)
}

// startWorkerOn is startWorker with the worker on connection nc.
func (e *outageEnv) startWorkerOn(t *testing.T, nc *nats.Conn, id string, concurrency int) {
	t.Helper()
	registered := make(chan struct{})
	var once sync.Once
	hooks := worker.Hooks{Registered: func(ev worker.Event) {
		if ev.Err == nil {
			once.Do(func() { close(registered) })
		}
	}}
	w, err := worker.New(worker.Config{ID: id, Runtime: &testkit.Runtime{Script: e.runs.run}, Store: leaseWatch{e.store, &e.held},
		NATS: nc, Concurrency: concurrency, Queue: outageQueue, Heartbeat: 300 * time.Millisecond, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker %s: %v", id, err)
		}
	})
	testkit.Closed(t, registered, 20*time.Second, "worker "+id+" to register its runtime")
}

// leaseWatch is the real store, counting deliveries it turned away because
// another attempt of the job held a live lease.
type leaseWatch struct {
	*cache.Store
	held *atomic.Int64
}

func (s leaseWatch) MarkRunningLeased(ctx context.Context, id, worker string, attempt int, at time.Time, l cache.Lease) (job.Status, error) {
	st, err := s.Store.MarkRunningLeased(ctx, id, worker, attempt, at, l)
	if errors.Is(err, cache.ErrLeased) {
		s.held.Add(1)
	}
	return st, err
}

// scriptedRuns runs a job's Python as far as these tests write it: an
// optional time.sleep(S), then print(N). It counts the runs of each job.
type scriptedRuns struct {
	mu    sync.Mutex
	n     map[string]int
	total atomic.Int64
}

var (
	sleepCall = regexp.MustCompile(`time\.sleep\(([0-9.]+)\)`)
	printCall = regexp.MustCompile(`print\('?([^')]*)'?\)`)
)

func (r *scriptedRuns) run(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
	r.mu.Lock()
	r.n[id]++
	r.mu.Unlock()
	r.total.Add(1)
	if m := sleepCall.FindStringSubmatch(spec.Code); m != nil {
		s, _ := strconv.ParseFloat(m[1], 64)
		run := time.NewTimer(time.Duration(s * float64(time.Second)))
		defer run.Stop()
		select {
		case <-run.C:
		case <-ctx.Done():
			return job.Result{}, fmt.Errorf("scripted run of %s: %w", id, ctx.Err())
		}
	}
	out := ""
	if m := printCall.FindStringSubmatch(spec.Code); m != nil {
		out = m[1] + "\n"
	}
	return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: out, Image: testkit.ScriptedImage}, nil
}

func (r *scriptedRuns) of(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id]
}

func py(format string, a ...any) job.Spec {
	return job.Spec{Runtime: "python", Code: fmt.Sprintf(format, a...)}
}

// The NATS server restarts (same store directory) during a load of 500
// jobs: every accepted job reaches a terminal state, none runs twice. The
// server stays down longer than AckWait while long jobs run, so JetStream
// redelivers jobs whose heartbeats it lost; the lease in the store must
// keep those duplicates from running.
func TestNATSRestartDuringLoad(t *testing.T) {
	e := startOutageEnv(t)
	e.startWorker(t, "outage-restart-a", 2)
	e.startWorker(t, "outage-restart-b", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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
				if i%25 == 0 { // long enough to span the outage
					spec = py("import time\ntime.sleep(3)\nprint(%d)", i)
				}
				id, n, err := testenv.SubmitRetrying(ctx, e.api, spec)
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
	time.Sleep(natsOutage) // the outage must outlast AckWait, as the server's own clock sees it
	e.nats.Start()
	wg.Wait()
	nRetried := 0
	retried.Range(func(any, any) bool { nRetried++; return true })
	for i, id := range ids {
		if id == "" {
			continue // its submission failed, reported above
		}
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

// Redis unavailable: the API answers 503 with a clear message, workers hold
// their jobs, and everything finishes once Redis is back.
func TestRedisOutage(t *testing.T) {
	e := startOutageEnv(t)
	e.startWorker(t, "outage-redis", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ids []string
	for i := range 4 {
		id, _, err := testenv.SubmitRetrying(ctx, e.api, py("import time\ntime.sleep(1)\nprint(%d)", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	e.redis.Stop()
	once, err := client.New(e.apiURL, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = once.Submit(ctx, py("print('while down')"))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 503 || !strings.Contains(ce.Detail+ce.Title, "Redis") || ce.RetryAfter <= 0 {
		t.Fatalf("submit with Redis down: %v (%+v)", err, ce)
	}
	// The outage lasts two AckWaits of the server's clock: held jobs must
	// not be redelivered or lost.
	time.Sleep(2 * outageQueue.AckWait)
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
	e := startOutageEnv(t)
	e.startWorker(t, "outage-held-a", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py("import time\ntime.sleep(8)\nprint('once')"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the job to run", func() bool {
		rec, err := e.store.GetJob(ctx, sub.ID)
		return err == nil && rec.Status == job.StatusRunning
	})
	// A second worker with a free slot, pulling, ready to take any
	// redelivery.
	e.startWorker(t, "outage-held-b", 1)
	e.nats.Stop()
	time.Sleep(natsOutage) // the outage must outlast AckWait, as the server's own clock sees it
	e.nats.Start()
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Stdout != "once\n" || v.Attempt != 1 || v.Worker != "outage-held-a" {
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
