package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Environment of the helper process that plays a worker killed mid-job.
const (
	envOrphanJob    = "KILN_TEST_ORPHAN_JOB"
	envOrphanWorker = "KILN_TEST_ORPHAN_WORKER"
	// orphanStarted is the line the helper prints once its job's code runs.
	orphanStarted = "kiln-test: the orphan's code runs"
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
	var once sync.Once
	base := Request{Output: func(_ string, p []byte) {
		if strings.Contains(string(p), "started") {
			once.Do(func() { fmt.Println(orphanStarted) })
		}
	}}
	ctx := context.Background()
	_, _ = rt.Run(ctx, asRun(base, id, spec)) // killed before it returns
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
	// The helper says on its stdout when the job's code runs.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stdout = pw
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait(); pr.Close() })
	// What the killed worker left besides its job's container (its pool's
	// sandboxes, its work dir mounts) goes the way a restart of that worker
	// would take it: the fleet's sweep only ends sandboxes.
	t.Cleanup(func() {
		dead, err := New(context.Background(), Config{Address: rt.cfg.Address, Namespace: rt.cfg.Namespace, WorkerID: deadWorker})
		if err != nil {
			t.Errorf("open the killed worker's runtime: %v", err)
			return
		}
		defer dead.Close()
		if _, err := dead.ReapOrphans(context.Background(), deadWorker); err != nil {
			t.Errorf("reap what the killed worker left: %v", err)
		}
	})
	codeRuns := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if sc.Text() == orphanStarted {
				close(codeRuns)
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr) // until the helper is gone
	}()

	// Wait until the job's sandbox runs, then kill its worker.
	filter := fmt.Sprintf("labels.%q==%s", ctrd.LabelJobID, strconv.Quote(id))
	var started time.Time
	testkit.Eventually(t, time.Minute, "the helper's sandbox to start", func() bool {
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
		return !started.IsZero()
	})
	// The job is asleep inside its limit.
	testkit.Closed(t, codeRuns, time.Minute, "the helper's job to run its code")
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	t.Logf("worker %s SIGKILLed %v after its sandbox started", deadWorker, time.Since(started).Round(time.Millisecond))

	// The survivor sweeps, treating the dead worker as alive (its lease
	// has not lapsed yet): only the deadline can remove it.
	var gone time.Duration
	testkit.Eventually(t, 30*time.Second, "the sweep to remove the killed worker's sandbox", func() bool {
		if _, err := rt.ReapExpired(ctx, func(string) bool { return true }); err != nil {
			t.Fatal(err)
		}
		cs, err := rt.client.Containers(nctx, filter)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) > 0 {
			return false
		}
		gone = time.Since(started)
		return true
	})
	limit := 4 * time.Second
	t.Logf("orphaned sandbox gone %v after it started (limit %v)", gone.Round(time.Millisecond), limit)
	if gone > limit+ctrd.DeadlineGrace+2*time.Second {
		t.Errorf("orphaned sandbox lived %v, want at most limit %v + grace %v + a sweep", gone, limit, ctrd.DeadlineGrace)
	}

	// containerd's exit event for the job's task: killed (SIGKILL), not
	// exited by itself, so the code never ran to completion.
	var exit *apievents.TaskExit
	testkit.ReceiveMatching(t, evs, 5*time.Second, "the orphaned sandbox's task exit event", func(env *events.Envelope) bool {
		ev, err := typeurl.UnmarshalAny(env.Event)
		if err != nil {
			t.Fatal(err)
		}
		exit, _ = ev.(*apievents.TaskExit)
		return exit != nil && strings.HasPrefix(exit.ContainerID, id+"-") // not another sandbox's
	})
	select {
	case err := <-evErrs:
		t.Fatalf("containerd events: %v", err)
	default:
	}
	t.Logf("task exit event: container %s status %d", exit.ContainerID, exit.ExitStatus)
	if exit.ExitStatus != 128+uint32(syscall.SIGKILL) {
		t.Errorf("task of the orphaned sandbox exited with %d, want %d (killed)", exit.ExitStatus, 128+int(syscall.SIGKILL))
	}
}
