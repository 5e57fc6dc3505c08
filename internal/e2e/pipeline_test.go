package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// Acceptance 1: submit → poll → Result for a success, a failing program and a
// timeout; ?wait= returns the finished Result in one call.
func TestSubmitPollResult(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-outcomes", 2)
	ctx := context.Background()

	cases := []struct {
		spec     job.Spec
		status   job.Status
		category job.Category
		stdout   string
	}{
		{py("print('hi')"), job.StatusSucceeded, "", "hi\n"},
		{py("import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)"), job.StatusFailed, job.CategoryRuntimeError, ""},
		{job.Spec{Code: "while True: pass", Limits: job.Limits{TimeoutMS: 1000}}, job.StatusTimedOut, job.CategoryTimeout, ""},
	}
	for _, tc := range cases {
		sub, err := e.api.Submit(ctx, tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if !sub.Accepted || sub.ID == "" || sub.TraceID == "" {
			t.Fatalf("submit: %+v", sub)
		}
		var v client.JobView
		// Plain polling, as a simple client would.
		testkit.Eventually(t, time.Minute, "job "+sub.ID+" to end", func() bool {
			if v, err = e.api.Get(ctx, sub.ID, 0); err != nil {
				t.Fatal(err)
			}
			return v.Terminal()
		})
		if v.Status != tc.status || (tc.category != "" && (v.Error == nil || v.Error.Category != tc.category)) {
			t.Fatalf("%q: got %s %+v, want %s %s", tc.spec.Code, v.Status, v.Error, tc.status, tc.category)
		}
		if v.TraceID != sub.TraceID {
			t.Fatalf("worker traced %s, API returned %s: not one trace", v.TraceID, sub.TraceID)
		}
		if v.Stdout != tc.stdout || v.Attempt != 1 || v.Worker != "e2e-outcomes" || v.Image.Digest == "" || v.CreatedAt == nil || v.FinishedAt == nil {
			t.Fatalf("result fields: %+v", v.Result)
		}
	}

	start := time.Now()
	sub, err := e.api.Submit(ctx, py("print(6*7)"), client.WithWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if sub.Accepted || sub.Status != job.StatusSucceeded || sub.Stdout != "42\n" {
		t.Fatalf("wait=30s answered %+v after %v", sub, time.Since(start))
	}
}

// Acceptance 2: a resubmitted job is a cache hit that runs nothing; any change
// to its inputs misses; cache:false always runs.
func TestResultCache(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-cache", 2)
	ctx := context.Background()
	run := func(spec job.Spec) client.Submission {
		t.Helper()
		sub, err := e.api.Submit(ctx, spec, client.WithWait(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if !sub.Terminal() {
			t.Fatalf("not finished within the wait: %+v", sub)
		}
		return sub
	}
	base := job.Spec{Code: "import sys\nprint(sys.stdin.read(), sys.argv[1:])", Stdin: "in", Args: []string{"a"}}
	first := run(base)
	if first.CacheHit || first.Stdout != "in ['a']\n" {
		t.Fatalf("first run: %+v", first.Result)
	}
	before := e.runs.total.Load()
	hit := run(base)
	if !hit.CacheHit || hit.Stdout != first.Stdout || e.runs.total.Load() != before {
		t.Fatalf("resubmission: cache_hit=%v, runs %d → %d", hit.CacheHit, before, e.runs.total.Load())
	}
	changes := map[string]func(*job.Spec){
		"code":   func(s *job.Spec) { s.Code += "\n" },
		"stdin":  func(s *job.Spec) { s.Stdin = "other" },
		"args":   func(s *job.Spec) { s.Args = []string{"b"} },
		"files":  func(s *job.Spec) { s.Files = []job.File{{Name: "x.txt", Content: "1"}} },
		"env":    func(s *job.Spec) { s.Env = map[string]string{"X": "1"} },
		"limits": func(s *job.Spec) { s.Limits.MemoryMB = 128 },
	}
	for name, change := range changes {
		s := base
		change(&s)
		before := e.runs.total.Load()
		if r := run(s); r.CacheHit || e.runs.total.Load() != before+1 {
			t.Errorf("changing %s: cache_hit=%v, runs %d → %d", name, r.CacheHit, before, e.runs.total.Load())
		}
	}
	off := base
	off.Cache = job.CacheOff()
	for range 2 {
		before := e.runs.total.Load()
		if r := run(off); r.CacheHit || e.runs.total.Load() != before+1 {
			t.Fatalf("cache:false: cache_hit=%v, runs %d → %d", r.CacheHit, before, e.runs.total.Load())
		}
	}
}

// Acceptance 6 (part): 20 identical jobs in flight run once.
func TestIdenticalInFlightRunOnce(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-coalesce", 2)
	ctx := context.Background()
	spec := py("import time\ntime.sleep(1)\nprint('once')")
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, err := e.api.Submit(ctx, spec, client.WithWait(30*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = sub.ID
			if sub.Status != job.StatusSucceeded || sub.Stdout != "once\n" {
				t.Errorf("submission %d: %+v", i, sub.Result)
			}
		}()
	}
	wg.Wait()
	if n := e.runs.total.Load(); n != 1 {
		t.Fatalf("20 identical submissions ran %d times, want 1 (ids %v)", n, ids)
	}
}

// Acceptance 3: a worker killed with SIGKILL mid-job; another worker runs the
// job as attempt 2 and it finishes once.
func TestWorkerKilledMidJob(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	// A short id lease: the rescuer's sweep reaps the victim's sandbox
	// about a second after the victim dies.
	victim := e.workerProc(t, "e2e-victim", "KILN_E2E_ID_LEASE=1s")
	sub, err := e.api.Submit(ctx, py("import time\ntime.sleep(2)\nprint('survived')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	e.startWorker(t, "e2e-rescuer", 1)
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Stdout != "survived\n" || v.Attempt != 2 || v.Worker != "e2e-rescuer" {
		t.Fatalf("after the crash: %+v", v.Result)
	}
	if n := e.runs.of(sub.ID); n != 1 {
		t.Fatalf("the rescuing worker ran the job %d times, want 1", n)
	}
	// The victim's orphaned sandbox ends (the rescuer's sweep reaps a
	// lapsed worker's); nothing it left may overwrite the result.
	testkit.Eventually(t, 30*time.Second, "the victim's sandbox to be reaped", func() bool {
		return len(sandboxesOf(t, e.containerd, "e2e-victim")) == 0
	})
	rec, err := e.store.GetJob(ctx, sub.ID)
	if err != nil || rec.Result.Worker != "e2e-rescuer" || rec.Result.Attempt != 2 {
		t.Fatalf("terminal record changed: %+v %v", rec.Result, err)
	}
}

// Acceptance 8: SIGTERM to a worker with running jobs: they finish and are acked.
func TestGracefulStop(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	w := e.workerProc(t, "e2e-graceful")
	sub, err := e.api.Submit(ctx, py("import time\ntime.sleep(2)\nprint('finished')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	state, err := w.Process.Wait()
	if err != nil || !state.Success() {
		t.Fatalf("worker exit: %v %v", state, err)
	}
	rec, err := e.store.GetJob(ctx, sub.ID)
	if err != nil || rec.Status != job.StatusSucceeded || rec.Result.Stdout != "finished\n" || rec.Result.Attempt != 1 {
		t.Fatalf("after SIGTERM: %+v %v", rec.Result, err)
	}
	// Nothing stranded: the job stream is empty (the job was acked), so
	// JetStream has nothing to deliver again to a new worker.
	e.waitAcked(t, 10*time.Second)
}

// Acceptance 6: 1,000 jobs from 20 concurrent clients across 2 workers: all
// terminal, counts per status exact, no job run twice.
func TestThousandJobsTwoWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("load test; skipped with -short")
	}
	e := setup(t)
	e.startWorker(t, "e2e-load-a", 2)
	e.startWorker(t, "e2e-load-b", 2)
	ctx := context.Background()
	const total, clients = 1000, 20
	want := map[job.Status]int{}
	specFor := func(i int) (job.Spec, job.Status) {
		switch i % 10 {
		case 0:
			return py("import sys; sys.exit(%d)  # job %d", 1+i%7, i), job.StatusFailed
		case 1:
			return py("print(%d"+")"+")", i), job.StatusFailed // syntax error
		default:
			return py("print(%d)", i), job.StatusSucceeded
		}
	}
	ids := make([]string, total)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < total; i += clients {
				spec, _ := specFor(i)
				sub, err := e.api.Submit(ctx, spec)
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
				ids[i] = sub.ID
			}
		}()
	}
	wg.Wait()
	for i := range total {
		_, st := specFor(i)
		want[st]++
	}
	got := map[job.Status]int{}
	deadline := time.Now().Add(10 * time.Minute)
	for i, id := range ids {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		v, err := e.api.Wait(wctx, id)
		cancel()
		if err != nil {
			t.Fatalf("job %d (%s): %v", i, id, err)
		}
		got[v.Status]++
		if _, st := specFor(i); v.Status != st {
			t.Errorf("job %d: status %s, want %s (%+v)", i, v.Status, st, v.Error)
		}
		if n := e.runs.of(id); n != 1 {
			t.Errorf("job %d ran %d times", i, n)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("status counts %v, want %v", got, want)
	}
	t.Logf("1000 jobs: %v", got)
}
