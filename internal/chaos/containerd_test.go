package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

const (
	// The slim Python image: on the box path like every Python runtime,
	// and the cheapest to copy into a private containerd.
	outageRuntime = "python-slim"
	outageImage   = "kiln.local/python-slim:latest"
	// containerdOutage is how long containerd stays dead.
	containerdOutage = 30 * time.Second
)

// Acceptance (issue 22, point 5): containerd is SIGKILLed for 30 s while
// two workers of four slots, one running jobs in boxes and one in a
// container each, run jobs from a backlog six clients keep filling, and
// more are submitted during the outage. Jobs are running at the kill, in
// boxes and in containers of their own (spanningJobs): some end while
// containerd is dead, one of them only just before its wall clock runs out
// then, some after containerd is back, and one runs out its wall clock
// while containerd is dead. Every job ends as it should (succeeded, or that
// one timed_out), on its first delivery, its code run once; no submission
// is refused; the workers' /readyz answer 503 naming the sandbox from the
// probe after the kill until containerd is back, then 200, and
// kiln_worker_sandbox_up reads 0, then 1.
func TestContainerdKilledUnderLoad(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctrd := startPrivateContainerd(t)
	ctrd.importImage(outageImage)
	// One worker runs its jobs in boxes (the default path), the other in a
	// container of their own each (the fallback).
	f := startFleet(t, ctrd, outageRuntime, outageImage, workerSpec{slots: 4}, workerSpec{slots: 4, boxesOff: true})
	t.Logf("set up in %v", time.Since(began).Round(time.Millisecond))
	load := &outageLoad{f: f, ctx: ctx, want: map[string]expected{}, done: map[string]bool{}}

	// First in the queue, the jobs that span the kill.
	spanning, spanningRestart := load.spanning(t)
	first := load.wave(0, 150, 0)
	testkit.Eventually(t, time.Minute, "the spanning jobs to start", func() bool {
		for _, id := range spanning {
			if f.ledger.of(id) == 0 {
				return false
			}
		}
		return true
	})
	spanStart := time.Now()
	testkit.Eventually(t, time.Minute, "5 jobs done", func() bool { return load.terminal() >= 5 })
	if err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	load.wantRunning(t, spanning, "at the kill")
	doneBefore := load.terminal()
	t.Logf("killing containerd: %d jobs done, the spanning jobs running for %v", doneBefore, time.Since(spanStart).Round(time.Millisecond))

	killedAt := time.Now()
	ctrd.kill()
	watch := watchReadiness(t, f.workers, killedAt)
	// Spread over all but the outage's last 5 s.
	second := load.wave(150, 250, (containerdOutage-5*time.Second)*clients/100)
	testkit.Eventually(t, 10*time.Second, "every worker not ready", watch.allDown)
	for _, w := range f.workers {
		if up := w.sandboxUp(t); up != 0 {
			t.Errorf("worker %s: %s = %d with containerd dead; want 0", w.id, ktrace.MetricSandboxUp, up)
		}
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("submissions while containerd was dead: %v", err)
	}
	if n := load.refused.Load(); n > 0 {
		t.Errorf("%d submissions refused (429 or 5xx) by the end of the outage", n)
	}
	time.Sleep(containerdOutage - time.Since(killedAt))
	watch.check(t)
	load.wantRunning(t, spanningRestart, "when containerd came back")
	heldDuring := f.ledger.held.Load()
	ctrd.start()
	restartedAt := time.Now()
	testkit.Eventually(t, time.Minute, "every worker ready again", f.allReady)
	t.Logf("workers ready %v after containerd restarted", time.Since(restartedAt).Round(time.Millisecond))
	for _, w := range f.workers {
		if up := w.sandboxUp(t); up != 1 {
			t.Errorf("worker %s: %s = %d after containerd came back; want 1", w.id, ktrace.MetricSandboxUp, up)
		}
	}

	var pending []string
	if !testkit.Poll(3*time.Minute, func() bool { pending = load.pending(); return len(pending) == 0 }) {
		t.Fatalf("%d jobs not terminal 3 minutes after containerd came back, e.g. %v", len(pending), pending[:min(5, len(pending))])
	}
	t.Logf("all %d jobs terminal %v after containerd came back", len(load.ids()), time.Since(restartedAt).Round(time.Millisecond))
	statuses := load.verify(t)
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitJobsDrained(t, js, 30*time.Second)
	t.Logf("statuses %v; %d runs, %d of them held for want of a sandbox (%d by the end of the outage); %v in all",
		statuses, f.ledger.calls.Load(), f.ledger.held.Load(), heldDuring, time.Since(began).Round(time.Millisecond))
}

// clients is how many clients submit the short jobs.
const clients = 6

// expected is how a job must end.
type expected struct {
	status job.Status
	stdout string
}

// outageLoad is the jobs submitted and how each must end.
type outageLoad struct {
	f       *fleet
	ctx     context.Context
	mu      sync.Mutex
	want    map[string]expected // by job id
	done    map[string]bool     // jobs seen terminal
	refused atomic.Int64        // submissions answered 429 or 5xx
}

func (l *outageLoad) submit(spec job.Spec, want expected) (string, error) {
	id, err := submitUntilAccepted(l.ctx, l.f.api, spec, &l.refused)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	l.want[id] = want
	l.mu.Unlock()
	return id, nil
}

// spanningJobs run across the kill: each prints, sleeps, then prints
// again. A disk size no box has been made for puts a job in a container of
// its own (the first job of a limits class finds no box); the others take
// a box if one is free. The kill comes a few seconds after they start, and
// containerd is back 30 s later.
var spanningJobs = []struct {
	sleep  int        // seconds
	limits job.Limits // besides the defaults
	status job.Status
	// restart: still running when containerd comes back.
	restart bool
}{
	{sleep: 20, limits: job.Limits{TimeoutMS: 90_000}, status: job.StatusSucceeded},
	{sleep: 45, limits: job.Limits{TimeoutMS: 90_000}, status: job.StatusSucceeded, restart: true},
	{sleep: 20, limits: job.Limits{TimeoutMS: 90_000, DiskMB: 65}, status: job.StatusSucceeded},
	{sleep: 45, limits: job.Limits{TimeoutMS: 90_000, DiskMB: 66}, status: job.StatusSucceeded, restart: true},
	// Its wall clock runs out while containerd is dead, after it ended.
	{sleep: 20, limits: job.Limits{TimeoutMS: 25_000, DiskMB: 67}, status: job.StatusSucceeded},
	// Its wall clock runs out while containerd is dead, before it ended:
	// its own init ends it.
	{sleep: 60, limits: job.Limits{TimeoutMS: 20_000, DiskMB: 68}, status: job.StatusTimedOut},
}

// spanning submits the spanningJobs; it returns their ids, and those of
// the ones that run past the restart.
func (l *outageLoad) spanning(t *testing.T) (all, restart []string) {
	t.Helper()
	for i, sj := range spanningJobs {
		spec := job.Spec{Runtime: outageRuntime, Limits: sj.limits,
			Code: fmt.Sprintf("print('ran', flush=True)\nimport time\ntime.sleep(%d)\nprint('span %d')", sj.sleep, i)}
		want := expected{status: sj.status, stdout: fmt.Sprintf("ran\nspan %d\n", i)}
		if sj.status == job.StatusTimedOut {
			want.stdout = "ran\n"
		}
		id, err := l.submit(spec, want)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, id)
		if sj.restart {
			restart = append(restart, id)
		}
	}
	return all, restart
}

// wave submits short jobs from..to-1 from the clients, each pausing pace
// before each of its submissions.
func (l *outageLoad) wave(from, to int, pace time.Duration) *errgroup.Group {
	g := &errgroup.Group{}
	for k := range clients {
		g.Go(func() error {
			for i := from + k; i < to; i += clients {
				time.Sleep(pace)
				spec := job.Spec{Runtime: outageRuntime, Code: fmt.Sprintf("print('ran', flush=True)\nprint(%d * %d)", i, i)}
				if _, err := l.submit(spec, expected{job.StatusSucceeded, fmt.Sprintf("ran\n%d\n", i*i)}); err != nil {
					return fmt.Errorf("submit short job %d: %w", i, err)
				}
			}
			return nil
		})
	}
	return g
}

func (l *outageLoad) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.want))
	for id := range l.want {
		ids = append(ids, id)
	}
	return ids
}

// pending lists the jobs not terminal yet.
func (l *outageLoad) pending() []string {
	var out []string
	for _, id := range l.ids() {
		l.mu.Lock()
		done := l.done[id]
		l.mu.Unlock()
		if done {
			continue
		}
		if rec, err := l.f.store.GetJob(l.ctx, id); err != nil || !rec.Status.Terminal() {
			out = append(out, id)
			continue
		}
		l.mu.Lock()
		l.done[id] = true
		l.mu.Unlock()
	}
	return out
}

// terminal counts the jobs seen terminal.
func (l *outageLoad) terminal() int {
	l.pending()
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// wantRunning fails the test unless every job of ids is running: the load
// came too slowly for the test to mean what it says.
func (l *outageLoad) wantRunning(t *testing.T, ids []string, when string) {
	t.Helper()
	for _, id := range ids {
		if rec, err := l.f.store.GetJob(l.ctx, id); err != nil || rec.Status != job.StatusRunning {
			t.Fatalf("spanning job %s is %q (%v) %s; it was to be running", id, rec.Status, err, when)
		}
	}
}

// verify checks that every job ended as expected, on its first delivery,
// its code run once; it returns the count of each status.
func (l *outageLoad) verify(t *testing.T) map[job.Status]int {
	t.Helper()
	statuses := map[job.Status]int{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, want := range l.want {
		rec, err := l.f.store.GetJob(l.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		statuses[rec.Status]++
		var problem string
		switch res := rec.Result; {
		case res == nil:
			problem = fmt.Sprintf("%s without a result", rec.Status)
		case rec.Status != want.status:
			problem = fmt.Sprintf("%s (%+v), want %s", rec.Status, res.Error, want.status)
		case res.Stdout != want.stdout:
			problem = fmt.Sprintf("stdout %q, want %q", res.Stdout, want.stdout)
		case res.Attempt != 1:
			problem = fmt.Sprintf("succeeded on delivery %d: the outage spent a delivery", res.Attempt)
		}
		if n := l.f.ledger.of(id); n != 1 {
			problem += fmt.Sprintf("; its code ran %d times", n)
		}
		if problem != "" {
			t.Errorf("job %s: %s; the fleet's log of it:\n%s", id, strings.TrimPrefix(problem, "; "), l.f.log.about(id))
		}
	}
	return statuses
}

// readinessWatch asks every worker's /readyz every 200 ms from the kill
// until check: once a worker answered 503, it must not answer 200 again.
type readinessWatch struct {
	workers  []fleetWorker
	killedAt time.Time
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	mu       sync.Mutex
	down     []time.Duration // since the kill, the first 503 of each; 0: none yet
	detail   []string        // that 503's body
	upAgain  []int           // 200s after it
}

func watchReadiness(t *testing.T, workers []fleetWorker, killedAt time.Time) *readinessWatch {
	w := &readinessWatch{workers: workers, killedAt: killedAt, stop: make(chan struct{}),
		down: make([]time.Duration, len(workers)), detail: make([]string, len(workers)), upAgain: make([]int, len(workers))}
	t.Cleanup(w.end) // a test that failed before check
	for i, fw := range workers {
		w.wg.Go(func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-w.stop:
					return
				case <-tick.C:
				}
				ok, body, err := fw.ready()
				w.mu.Lock()
				switch {
				case err != nil:
				case !ok && w.down[i] == 0:
					w.down[i], w.detail[i] = time.Since(w.killedAt), body
				case ok && w.down[i] != 0:
					w.upAgain[i]++
				}
				w.mu.Unlock()
			}
		})
	}
	return w
}

// end stops the watch and waits for its probes.
func (w *readinessWatch) end() {
	w.stopOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
}

func (w *readinessWatch) allDown() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.down {
		if d == 0 {
			return false
		}
	}
	return true
}

// check stops the watch and fails the test for a worker that answered
// ready again, or whose 503 did not name the sandbox.
func (w *readinessWatch) check(t *testing.T) {
	t.Helper()
	w.end()
	for i, fw := range w.workers {
		t.Logf("worker %s: 503 %v after the kill: %s", fw.id, w.down[i].Round(time.Millisecond), strings.TrimSpace(w.detail[i]))
		if w.upAgain[i] > 0 {
			t.Errorf("worker %s answered ready %d times with containerd dead", fw.id, w.upAgain[i])
		}
		if !strings.Contains(w.detail[i], `"sandbox":"unavailable`) {
			t.Errorf("worker %s: /readyz while containerd was dead does not name the sandbox: %s", fw.id, w.detail[i])
		}
	}
}
