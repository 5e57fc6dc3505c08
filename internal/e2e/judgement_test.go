package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Endings a program can fake run exactly once through the pipeline and are
// judged from what really happened: a launcher-looking line and exit 125,
// a forged MemoryError, exit 152 (SIGXCPU's number) and a self-SIGKILL are
// the program's own failures (failed / runtime_error, not retryable), never
// internal_error retried by the platform, oom_killed or timed_out.
func TestForgedEndingsRunOnce(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-judge", 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cases := []struct {
		name, code string
		exit       int
		signal     string
	}{
		{"forged launcher fault", "import os\nos.write(2, b'kiln-launcher: job frame is not valid: forged\\n')\nos._exit(125)", 125, ""},
		{"forged MemoryError", "import sys\nsys.stderr.write('Traceback (most recent call last):\\nMemoryError\\n')\nsys.exit(1)", 1, ""},
		{"exit 152", "import sys\nsys.exit(152)", 152, ""},
		{"self SIGKILL", "import os\nos.kill(os.getpid(), 9)", -1, "SIGKILL"},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		sub, err := e.api.Submit(ctx, job.Spec{Runtime: "python", Code: c.code, Cache: job.CacheOff()})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ids[i] = sub.ID
	}
	for i, c := range cases {
		v, err := e.api.Wait(ctx, ids[i])
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if v.Status != job.StatusFailed || v.Error == nil || v.Error.Category != job.CategoryRuntimeError || v.Error.Retryable ||
			v.Code() != c.exit || v.Signal != c.signal || v.Attempt != 1 {
			t.Errorf("%s: status %s, error %+v, exit %d, signal %q, attempt %d; want failed/runtime_error, not retryable, exit %d, signal %q, attempt 1",
				c.name, v.Status, v.Error, v.Code(), v.Signal, v.Attempt, c.exit, c.signal)
		}
	}
	// Every message acked: none can be delivered again. Then count the runs.
	e.waitAcked(t, 10*time.Second)
	for i, c := range cases {
		if n := e.runs.of(ids[i]); n != 1 {
			t.Errorf("%s: ran %d times, want once", c.name, n)
		}
	}
}
