package e2e

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// Acceptance (boxes): a run never outlives its worker's claim on it. A worker
// SIGKILLed or SIGSTOPped while its job runs in a box: the box's supervisor
// ends the job within about a second (the socket closed, or no heartbeat), so
// the first run's code never finishes, and the redelivery on another worker
// is the run that completes.
func TestBoxJobEndsWithItsWorker(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"kill": syscall.SIGKILL, "stop": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) {
			e := setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			victimID := "e2e-box-victim-" + name
			victim := e.workerProc(t, victimID)
			if sig == syscall.SIGSTOP {
				t.Cleanup(func() { _ = victim.Process.Signal(syscall.SIGCONT) })
			}
			// Warm up until the tenant's job runs in a box (in a box,
			// /run/kiln is an empty mount; in a container it holds kiln-init).
			testkit.Eventually(t, time.Minute, "a job to run in a box", func() bool {
				warm, err := e.api.Submit(ctx, job.Spec{Runtime: "python", Code: "import os; print(len(os.listdir('/run/kiln')))", Cache: job.CacheOff()})
				if err != nil {
					t.Fatal(err)
				}
				v, err := e.api.Wait(ctx, warm.ID)
				if err != nil {
					t.Fatal(err)
				}
				return v.Stdout == "0\n"
			})
			spec := py("import time\nopen('/work/started', 'w').write('x')\ntime.sleep(2)\nopen('/work/finished', 'w').write('x')\ntime.sleep(60)")
			spec.Limits = job.Limits{TimeoutMS: 6000}
			spec.Cache = job.CacheOff()
			sub, err := e.api.Submit(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
			// Its code runs: its first file is on the box's host tmpfs.
			jobDirs := filepath.Join(sandbox.StateDirDefault, victimID, "*", "work", "j*")
			testkit.Eventually(t, 30*time.Second, "the job's code to start", func() bool {
				got, _ := filepath.Glob(filepath.Join(jobDirs, "started"))
				return len(got) > 0
			})
			if err := victim.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			e.startWorker(t, victimID+"-rescuer", 1)
			// The rescuer's run ends at its 6 s limit, long past the moment
			// the first run would have written its file.
			rec := e.waitRecord(t, sub.ID, time.Minute, func(r cache.Record) bool { return r.Status.Terminal() })
			jobs, _ := filepath.Glob(jobDirs)
			if len(jobs) == 0 {
				t.Fatalf("no job work dir of the victim's box under %s", filepath.Join(sandbox.StateDirDefault, victimID))
			}
			for _, d := range jobs {
				if _, err := os.Stat(filepath.Join(d, "finished")); err == nil {
					t.Errorf("the first run's code finished after its worker was %s", sig)
				}
			}
			if rec.Status != job.StatusTimedOut || rec.Result.Attempt < 2 || rec.Result.Worker != victimID+"-rescuer" {
				t.Errorf("after the %s: %s attempt %d worker %q; want the rescuer's run, timed out", sig, rec.Status, rec.Result.Attempt, rec.Result.Worker)
			}
		})
	}
}
