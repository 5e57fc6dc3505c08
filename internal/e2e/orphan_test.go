package e2e

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sandboxctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	kclient "github.com/kilnrun/kiln/producer/client"
)

// taskLife is one sandbox task's start and exit, from containerd's events.
type taskLife struct {
	start, exit time.Time
	status      uint32
	exited      bool
}

// Acceptance: a worker SIGKILLed while its job sleeps past its 4 s limit.
// Its sandbox, which its own timer can no longer end, is gone within the
// limit plus a few seconds (the surviving worker's sweep), and its task was
// killed, not run to completion, before the redelivery's sandbox started:
// shown from containerd's task events.
func TestKilledWorkersSandboxEndsBeforeRedelivery(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())
	evs, evErrs := client.EventService().Subscribe(nctx, `topic=="/tasks/start"`, `topic=="/tasks/exit"`)

	// A container of its own: the fallback's orphan is what is watched here
	// (a box job's: TestBoxJobEndsWithItsWorker).
	victim := e.workerProc(t, "e2e-orphan-victim", "KILN_E2E_BOXES_OFF=1")
	spec := py("import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('completed')")
	spec.Limits = job.Limits{TimeoutMS: 4000}
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}

	// Collect the job's task events in the background.
	var mu sync.Mutex
	tasks := map[string]*taskLife{} // by container id
	// One signal per start and per exit of the job's sandboxes.
	started, exited := make(chan struct{}, 8), make(chan struct{}, 8)
	go func() {
		for {
			select {
			case env := <-evs:
				ev, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				mu.Lock()
				switch ev := ev.(type) {
				case *apievents.TaskStart:
					if strings.HasPrefix(ev.ContainerID, sub.ID+"-") {
						tasks[ev.ContainerID] = &taskLife{start: env.Timestamp}
						started <- struct{}{}
					}
				case *apievents.TaskExit:
					if l := tasks[ev.ContainerID]; l != nil && ev.ID == ev.ContainerID {
						l.exit, l.status, l.exited = env.Timestamp, ev.ExitStatus, true
						exited <- struct{}{}
					}
				}
				mu.Unlock()
			case <-evErrs:
				return
			case <-ctx.Done():
				return
			}
		}
	}()

	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	e.startWorker(t, "e2e-orphan-rescuer", 1, withBoxesOff())
	// The job sleeps in its sandbox, inside its limit: its program has
	// printed "started" (its live output), not only its task begun.
	testkit.Receive(t, started, 30*time.Second, "the victim's sandbox to start")
	running := make(chan struct{})
	go func() {
		errStop := errors.New("seen")
		_ = e.api.Events(ctx, sub.ID, "", func(ev kclient.Event) error {
			if ev.Type == job.EventStdout && strings.Contains(string(ev.Data), "started") {
				close(running)
				return errStop
			}
			return nil
		})
	}()
	testkit.Closed(t, running, 30*time.Second, "the victim's program to print that it started")
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	killedAt := time.Now()

	rec := e.waitRecord(t, sub.ID, time.Minute, func(r cache.Record) bool { return r.Status.Terminal() })
	if rec.Status != job.StatusTimedOut || rec.Result.Attempt != 2 || rec.Result.Worker != "e2e-orphan-rescuer" {
		t.Fatalf("after the crash: %s attempt %d worker %q", rec.Status, rec.Result.Attempt, rec.Result.Worker)
	}
	// Both sandboxes' exit events (the rescuer's may trail its record).
	testkit.Receive(t, exited, 30*time.Second, "the first sandbox's exit event")
	testkit.Receive(t, exited, 30*time.Second, "the second sandbox's exit event")
	mu.Lock()
	defer mu.Unlock()
	if len(tasks) != 2 {
		t.Fatalf("want the job's two sandboxes (victim's, rescuer's) in containerd's events, got %d: %+v", len(tasks), tasks)
	}
	var first, second *taskLife
	for _, l := range tasks {
		if first == nil || l.start.Before(first.start) {
			first, second = l, first
		} else {
			second = l
		}
	}
	if !first.exited {
		t.Fatal("the victim's sandbox never exited")
	}
	lived := first.exit.Sub(first.start)
	t.Logf("victim SIGKILLed %v after its sandbox started; the sandbox was killed (status %d) %v after it started; the redelivery's sandbox started %v after that",
		killedAt.Sub(first.start).Round(time.Millisecond), first.status, lived.Round(time.Millisecond), second.start.Sub(first.exit).Round(time.Millisecond))
	if limit := 4 * time.Second; lived > limit+sandboxctrd.DeadlineGrace+2*time.Second {
		t.Errorf("the orphaned sandbox lived %v, want at most its limit %v + %v + a sweep", lived, limit, sandboxctrd.DeadlineGrace)
	}
	if first.status != 128+uint32(syscall.SIGKILL) {
		t.Errorf("the orphaned sandbox's task exited with %d, want %d (killed: the code did not run to completion)", first.status, 128+int(syscall.SIGKILL))
	}
	if !first.exit.Before(second.start) {
		t.Errorf("the redelivery's sandbox started at %v, before the orphan ended at %v", second.start, first.exit)
	}
}
