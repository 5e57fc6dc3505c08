package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	sandboxctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Acceptance 5 (issue 8), against real containerd: a second worker process
// started with the id of a live worker refuses to start, saying why, and the
// first one's running sandbox is left alone: it exists for the whole life of
// the second process, and its job succeeds on its first attempt with all of
// its output. (Before the id lease, the second worker's start-up reaping
// removed that sandbox and the job was recorded failed.)
// worker.TestSecondWorkerWithLiveIDRefusesToStart checks the logic fast,
// with a scripted runtime.
func TestSecondWorkerWithSameIDLeavesFirstsSandbox(t *testing.T) {
	e := setup(t)
	const id = "e2e-same-id"
	t.Cleanup(func() { reapWorker(t, e.containerd, id) })
	e.startWorker(t, id, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cc, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	nctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())
	// The job's sandbox: a container of its own labelled with the job, or
	// the box it runs in, which carries only its worker's label (and the
	// worker keeps no other box busy: one slot).
	sandboxes := func(jobID string) int {
		cs, err := cc.Containers(nctx, fmt.Sprintf("labels.%q==%s", sandboxctrd.LabelJobID, strconv.Quote(jobID)))
		if err == nil && len(cs) == 0 {
			cs, err = cc.Containers(nctx, fmt.Sprintf("labels.%q==%s", sandboxctrd.LabelWorker, strconv.Quote(id)))
		}
		if err != nil {
			t.Fatalf("list containers: %v", err)
		}
		return len(cs)
	}

	sub, err := e.api.Submit(ctx, py("import time\nprint('started', flush=True)\ntime.sleep(8)\nprint('survived')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	testkit.Eventually(t, 20*time.Second, "the job's sandbox to appear in containerd", func() bool { return sandboxes(sub.ID) > 0 })

	// The second worker: a process of its own, same id, same containerd
	// namespace. Its id lease of 1s makes it give up after about 2s of
	// waiting for the first one's lease to lapse, well within the job.
	second := e.workerCmd(id, "KILN_E2E_ID_LEASE=1s")
	var stderr bytes.Buffer
	second.Stdout = os.Stderr
	second.Stderr = io.MultiWriter(os.Stderr, &stderr) // read only once Wait has returned
	startedAt := time.Now()
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	var exitErr error
	exited := make(chan struct{})
	go func() { exitErr = second.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = second.Process.Kill()
		<-exited
	})
	missing := 0 // polls that found the first worker's sandbox gone while the second one lived
	if !testkit.Poll(time.Minute, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		if sandboxes(sub.ID) == 0 {
			missing++
		}
		return false
	}) {
		t.Fatal("the second worker neither refused nor stopped within a minute")
	}
	lived := time.Since(startedAt)
	rec, err := e.store.GetJob(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != job.StatusRunning || sandboxes(sub.ID) == 0 {
		t.Fatalf("when the second worker exited (%v after it started) the first one's job was %s with %d sandboxes: the test proved nothing",
			lived.Round(time.Millisecond), rec.Status, sandboxes(sub.ID))
	}
	if exitErr == nil || !strings.Contains(stderr.String(), "distinct --id") {
		t.Errorf("second worker with a live id: exit %v; want a refusal naming the fix (distinct --id); its log:\n%s", exitErr, stderr.String())
	}
	if missing > 0 {
		t.Errorf("the first worker's sandbox was missing in %d polls while the second worker started", missing)
	} else {
		t.Logf("second worker refused to start after %v (%v); the first one's sandbox stayed throughout", lived.Round(time.Millisecond), exitErr)
	}

	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Stdout != "started\nsurvived\n" || v.Attempt != 1 || v.Worker != id {
		t.Fatalf("first worker's job: %s %q attempt %d worker %q %+v", v.Status, v.Stdout, v.Attempt, v.Worker, v.Error)
	}
	if n := e.runs.of(sub.ID); n != 1 {
		t.Fatalf("job ran %d times, want 1", n)
	}
	if alive, err := e.store.WorkerAlive(ctx, id); err != nil || !alive {
		t.Fatalf("the first worker's id lease after the refused start: alive=%v %v", alive, err)
	}
}
