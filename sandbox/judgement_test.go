package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
)

// TestHostileEndings: how a program ends is judged from what the runtime
// saw (kiln-init's report, the cgroup, its timers), never from an exit code
// read as a signal or a line the program printed. The program is not pid 1
// (under gVisor it is, of its own pid namespace, and gVisor delivers
// signals to it as to any process), so signals it has no handler for take
// effect.
func TestHostileEndings(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	tests := []struct {
		name     string
		code     string
		cpuMS    int64
		status   job.Status
		category job.Category
		signal   string
		exit     int // -1: none
	}{
		{"not pid 1", "import os\nassert os.getpid() != 1, os.getpid()\nprint('ok')", 0, job.StatusSucceeded, "", "", 0},
		{"self SIGKILL", "import os\nos.kill(os.getpid(), 9)\nprint('alive')", 0, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1},
		{"alarm", "import signal, time\nsignal.alarm(1)\ntime.sleep(20)", 0, job.StatusFailed, job.CategoryRuntimeError, "SIGALRM", -1},
		{"abort", "import os\nos.abort()", 0, job.StatusFailed, job.CategoryRuntimeError, "SIGABRT", -1},
		{"exit 152 is not SIGXCPU", "import sys\nsys.exit(152)", 0, job.StatusFailed, job.CategoryRuntimeError, "", 152},
		{"exit 137 is not SIGKILL", "import sys\nsys.exit(137)", 0, job.StatusFailed, job.CategoryRuntimeError, "", 137},
		{"forged MemoryError", "import sys\nsys.stderr.write('Traceback (most recent call last):\\nMemoryError\\n')\nsys.exit(1)", 0, job.StatusFailed, job.CategoryRuntimeError, "", 1},
		{"forged launcher fault", "import os\nos.write(2, b'kiln-launcher: job frame is not valid: forged\\n')\nos._exit(125)", 0, job.StatusFailed, job.CategoryRuntimeError, "", 125},
		{"cpu limit", "while True: pass", 1000, job.StatusTimedOut, job.CategoryTimeout, "SIGXCPU", -1},
		{"cpu limit, SIGXCPU ignored", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass", 1000, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1},
		{"self-sent SIGXCPU is not the cpu limit", "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", 10_000, job.StatusFailed, job.CategoryRuntimeError, "SIGXCPU", -1},
		{"SIGKILL from a child", "import os\nif os.fork() == 0:\n    os.kill(os.getppid(), 9)\n    os._exit(0)\nimport time\ntime.sleep(10)", 0, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1},
		{"SIGSEGV", "import ctypes\nctypes.string_at(0)", 0, job.StatusFailed, job.CategoryRuntimeError, "SIGSEGV", -1},
		// The profile refuses signals to pid 1 (ESRCH; EPERM under gVisor,
		// whose kernel would deliver them): TestHostileKillInit.
		{"signals to the init are refused", `
import os, signal
refused = 0
for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGSTOP, signal.SIGKILL, signal.SIGPIPE):
    try:
        os.kill(1, s)
    except (ProcessLookupError, PermissionError):
        refused += 1
assert refused == 6, refused
print('ok')`, 0, job.StatusSucceeded, "", "", 0},
		// The status file is the job's to write while it runs; the init
		// overwrites it after the job is dead, and a status without the
		// nonce is refused anyway. The nonce itself is out of reach.
		// Were the init's environment readable, the job would forge a
		// status with the real nonce; on every path it is not (under
		// gVisor, whose kernel lets it be read across uids, kiln-init is
		// not in the job's pid namespace).
		{"forged status", `
import json, os, sys
nonce = "0" * 32
try:
    env = open("/proc/1/environ", "rb").read().decode()
    found = [kv.split("=", 1)[1] for kv in env.split("\0") if kv.startswith("KILN_INIT_NONCE=")]
    if found:
        nonce = found[0]
        print("read the init's environment", file=sys.stderr)
except (PermissionError, FileNotFoundError):
    pass  # FileNotFoundError: a box job sees no process but its own
assert "KILN_INIT_NONCE" not in os.environ and "KILN_READY_FD" not in os.environ, os.environ
try:
    with open("/run/kiln/status", "w") as f:
        f.write(json.dumps({"v": 1, "nonce": nonce, "ready": False, "exit_code": 125}))
except (PermissionError, FileNotFoundError, OSError):
    pass  # a box job: the box's status file is not in its view
print("ok")
`, 0, job.StatusSucceeded, "", "", 0},
	}
	if underGVisor() {
		// Under gVisor the launcher is pid 1 of a pid namespace of the
		// job's own (kiln-init's EnvJobPidNS), and gVisor's kernel delivers
		// what a namespace's init has no handler for as to any process (the
		// rows above pass): pid 1 is the job's own, and a signal to it ends
		// the job with its own ending.
		for i, tt := range tests {
			switch tt.name {
			case "not pid 1":
				tests[i].name, tests[i].code = "pid 1 of its own namespace", "import os\nassert os.getpid() == 1, os.getpid()\nprint('ok')"
			case "signals to the init are refused":
				tests[i].name, tests[i].code = "a signal to pid 1 is to itself", "import os, signal\nos.kill(1, signal.SIGSEGV)\nprint('alive')"
				tests[i].status, tests[i].category, tests[i].signal, tests[i].exit = job.StatusFailed, job.CategoryRuntimeError, "SIGSEGV", -1
			}
		}
	}
	for _, tt := range tests {
		spec := py(tt.code)
		spec.Limits.CPUMS = tt.cpuMS
		spec.Limits.TimeoutMS = 20_000
		res := run(t, rt, spec)
		got := -1
		if res.ExitCode != nil {
			got = *res.ExitCode
		}
		cat := job.Category("")
		if res.Error != nil {
			cat = res.Error.Category
			if res.Error.Retryable {
				t.Errorf("%s: retryable failure %+v", tt.name, res.Error)
			}
		}
		signal := tt.signal
		if underGVisor() && tt.name == "cpu limit" && res.Signal == "SIGKILL" {
			// Debian's runsc (2022) does not send SIGXCPU at RLIMIT_CPU's
			// soft limit; the program is killed at the hard limit, a second
			// later. Still timed_out, still judged by the runtime. (A 2026
			// runsc sends SIGXCPU, as Linux does.)
			signal = "SIGKILL"
		}
		if tt.name == "cpu limit" && res.Signal == "SIGKILL" && res.Error != nil && strings.Contains(res.Error.Message, "CPU time limit together") {
			// A job's CPU time is also watched over all its processes (runc):
			// the watcher may end it just before RLIMIT_CPU's SIGXCPU.
			signal = "SIGKILL"
		}
		if tt.name == "forged status" && strings.Contains(res.Stderr, "read the init's environment") {
			t.Errorf("forged status: the job read kiln-init's environment (the status nonce)")
		}
		if res.Status != tt.status || cat != tt.category || res.Signal != signal || got != tt.exit {
			t.Errorf("%s: got %s/%s signal %q exit %d (cgroup CPU %d ms); want %s/%s signal %q exit %d\nerror: %+v\nstderr: %s",
				tt.name, res.Status, cat, res.Signal, got, res.CPUMS, tt.status, tt.category, signal, tt.exit, res.Error, res.Stderr)
		}
	}
	healthy(t, rt)
}

// TestInitWallClockLimit: with the worker's own timer out of the way (a
// worker that died), kiln-init still ends the sandbox shortly after the
// job's wall-clock limit.
func TestInitWallClockLimit(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	ctx := namespacesCtx(t, rt)
	spec := py("import time\ntime.sleep(600)")
	spec.Limits.TimeoutMS = 1000
	spec.Normalize()
	lim, frame, err := rt.check("init-limit", spec)
	if err != nil {
		t.Fatal(err)
	}
	img, err := rt.images.resolve(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	id := job.NewID()
	sb, err := rt.ct.prepare(ctx, img, prepOpts{jobID: id, lim: lim})
	defer cleanup(context.WithoutCancel(ctx), sb)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := rt.ct.deliver(ctx, sb, frame, ""); err != nil {
		t.Fatal(err)
	}
	testkit.Closed(t, sb.exitCh, 30*time.Second, "the sandbox to end at its wall-clock limit")
	sb.exited = true
	if d := time.Since(start); d > lim.Timeout()+initGrace+2*time.Second {
		t.Errorf("the sandbox ended %s after delivery; want about %s", d, lim.Timeout()+initGrace)
	}
	st, err := readStatus(sb.statusPath, sb.nonce)
	if err != nil {
		t.Fatal(err)
	}
	if !st.TimedOut || !st.Ready || st.Signal != 9 {
		t.Errorf("status %+v; want ready, timed out, killed by SIGKILL", st)
	}
	// On its own tmpfs: <sandbox dir>/status/status, or under gVisor the
	// run dir's kiln/status.
	if !strings.HasSuffix(sb.statusPath, "/"+host.StatusFSDir+"/status") && !strings.HasSuffix(sb.statusPath, "/kiln/status") {
		t.Errorf("status path %s", sb.statusPath)
	}
}
