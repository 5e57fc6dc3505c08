package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// forgeException is Python that writes an exception record of its own
// straight onto its output channel's descriptor (the one the launcher
// holds): a MemoryError at line 999999 with the launcher's frames.
const forgeException = `import builtins, json, os
fd = builtins.display.__self__.fd
rec = {"exception": {"type": "MemoryError", "message": "forged", "line": 999999,
       "frames": [{"file": "/usr/lib/kiln/launch.py", "line": 700, "function": "run_job"},
                  {"file": "/work/main.py", "line": 999999, "function": "<module>"}]}}
os.write(fd, (json.dumps(rec) + "\n").encode())
`

// Issue 40, acceptance 4: the exception a result carries is the launcher's
// account of an uncaught exception, never one a program wrote onto its
// channel and then exited otherwise. A forged record and sys.exit(3):
// failed, exit 3, no exception, the record counted in outputs_dropped, run
// once. A forged record and then a real exception: two records, neither
// attached. A real exception: attached, with the program's frames only.
func TestForgedExceptionIsNotAttached(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-exception", 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cases := []struct {
		name, code string
		exit       int
		attached   bool
	}{
		{"forged, then sys.exit(3)", forgeException + "import sys\nsys.exit(3)\n", 3, false},
		{"forged, then a real exception", forgeException + "raise ValueError('real')\n", 1, false},
		{"a real exception", "def f():\n    return 1 / 0\n\nf()\n", 1, true},
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
		if v.Status != job.StatusFailed || v.Error == nil || v.Error.Category != job.CategoryRuntimeError || v.Code() != c.exit || v.Attempt != 1 {
			t.Errorf("%s: status %s, error %+v, exit %d, attempt %d; want failed/runtime_error, exit %d, attempt 1",
				c.name, v.Status, v.Error, v.Code(), v.Attempt, c.exit)
			continue
		}
		exc := v.Error.Exception
		switch {
		case !c.attached && exc != nil:
			t.Errorf("%s: exception attached: %+v", c.name, exc)
		case !c.attached && (v.OutputsDropped < 1 || !v.OutputsTruncated):
			t.Errorf("%s: outputs_dropped %d, truncated %v; want the record counted", c.name, v.OutputsDropped, v.OutputsTruncated)
		case c.attached && (exc == nil || exc.Type != "ZeroDivisionError" || exc.Line != 2 || len(exc.Frames) != 2):
			t.Errorf("%s: exception %+v; want ZeroDivisionError at line 2 with the program's two frames", c.name, exc)
		case c.attached:
			for _, f := range exc.Frames {
				if !strings.HasPrefix(f.File, "/work/") {
					t.Errorf("%s: a frame outside the program's files: %+v", c.name, f)
				}
			}
		}
	}
	e.waitAcked(t, 10*time.Second)
	for i, c := range cases {
		if n := e.runs.of(ids[i]); n != 1 {
			t.Errorf("%s: ran %d times, want once", c.name, n)
		}
	}
}
