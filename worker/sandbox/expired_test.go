package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"

	"github.com/kilnrun/kiln/job"
)

// Environment of the helper process that plays a worker killed mid-job.
const (
	envOrphanJob    = "KILN_TEST_ORPHAN_JOB"
	envOrphanWorker = "KILN_TEST_ORPHAN_WORKER"
)

// TestHelperOrphanRun is not a test: TestExpiredSandboxOfKilledWorkerIsReaped
// runs this test binary with it as a worker process that starts a job and
// is SIGKILLed while the job runs.
func TestHelperOrphanRun(t *testing.T) {
	id := os.Getenv(envOrphanJob)
	if id == "" {
		return // only as a helper process
	}
	rt, err := New(context.Background(), Config{Address: os.Getenv("KILN_CONTAINERD_ADDRESS"), Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"), WorkerID: os.Getenv(envOrphanWorker)})
	if err != nil {
		t.Fatal(err)
	}
	spec := job.Spec{Runtime: "python", Code: "import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('completed')", Limits: job.Limits{TimeoutMS: 4000}}
	_, _ = rt.Run(context.Background(), id, spec) // killed before it returns
}

// A worker SIGKILLed while its job sleeps past its 4 s limit: its own timer
// is gone with it, so the fleet (here: another worker's sweep, ReapExpired,
// run as the worker does every second) must end the sandbox within the
// limit plus a few seconds, and containerd's task events show that the code
// did not run to completion.
func TestExpiredSandboxOfKilledWorkerIsReaped(t *testing.T) {
	rt := setup(t) // the surviving worker on the same host
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	nctx := namespaces.WithNamespace(ctx, rt.cfg.Namespace)
	id := job.NewID()
	deadWorker := "killed-" + randomHex(3)

	// Watch the job's task exits from the start.
	evs, evErrs := rt.client.EventService().Subscribe(nctx, `topic=="/tasks/exit"`)

	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperOrphanRun$", "-test.count=1")
	child.Env = append(os.Environ(), envOrphanJob+"="+id, envOrphanWorker+"="+deadWorker,
		"KILN_CONTAINERD_ADDRESS="+rt.cfg.Address, "KILN_CONTAINERD_NAMESPACE="+rt.cfg.Namespace)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	// Wait until the job's sandbox runs, then kill its worker.
	filter := fmt.Sprintf("labels.%q==%s", LabelJobID, strconv.Quote(id))
	var started time.Time
	for started.IsZero() {
		cs, err := rt.client.Containers(nctx, filter)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 1 {
			if task, err := cs[0].Task(nctx, nil); err == nil {
				if st, err := task.Status(nctx); err == nil && st.Status == "running" {
					started = time.Now()
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the helper's sandbox never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // the job is asleep inside its limit
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	t.Logf("worker %s SIGKILLed %v after its sandbox started", deadWorker, time.Since(started).Round(time.Millisecond))

	// The survivor sweeps every second, treating the dead worker as alive
	// (its lease has not lapsed yet): only the deadline can remove it.
	var gone time.Duration
	for gone == 0 {
		if _, err := rt.ReapExpired(ctx, func(string) bool { return true }); err != nil {
			t.Fatal(err)
		}
		cs, err := rt.client.Containers(nctx, filter)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 0 {
			gone = time.Since(started)
			break
		}
		if time.Since(started) > 30*time.Second {
			t.Fatalf("sandbox of the killed worker still there %v after it started", time.Since(started))
		}
		time.Sleep(time.Second)
	}
	limit := 4 * time.Second
	t.Logf("orphaned sandbox gone %v after it started (limit %v)", gone.Round(time.Millisecond), limit)
	if gone > limit+DeadlineGrace+2*time.Second {
		t.Errorf("orphaned sandbox lived %v, want at most limit %v + grace %v + a sweep", gone, limit, DeadlineGrace)
	}

	// containerd's exit event for the job's task: killed (SIGKILL), not
	// exited by itself, so the code never ran to completion.
	deadline := time.After(5 * time.Second)
	for {
		select {
		case env := <-evs:
			ev, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				t.Fatal(err)
			}
			exit, ok := ev.(*apievents.TaskExit)
			if !ok || !strings.HasPrefix(exit.ContainerID, id+"-") {
				continue // another sandbox's
			}
			t.Logf("task exit event: container %s status %d", exit.ContainerID, exit.ExitStatus)
			if exit.ExitStatus != 128+uint32(syscall.SIGKILL) {
				t.Errorf("task of the orphaned sandbox exited with %d, want %d (killed)", exit.ExitStatus, 128+int(syscall.SIGKILL))
			}
			return
		case err := <-evErrs:
			t.Fatalf("containerd events: %v", err)
		case <-deadline:
			t.Fatal("no task exit event for the orphaned sandbox")
		}
	}
}
