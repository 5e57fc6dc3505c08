package sandbox

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// hostileCall is a hostile program run as a session's call, and what its
// result may be.
type hostileCall struct {
	name string
	code string
	lim  job.Limits
	ok   func(job.Result) bool
}

// hostileCalls runs each call in s; after each, s serves its next call
// (next prints 42), victim (another tenant's session) answers probe with
// want, and the runtime runs a job.
func hostileCalls(t *testing.T, rt *Containerd, s, victim *Session, calls []hostileCall, next, probe, want string) {
	t.Helper()
	for _, c := range calls {
		base := Request{Tenant: "acme"}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		res, info, err := s.Exec(ctx, asRun(base, job.NewID(), job.Spec{Code: c.code, Limits: c.lim}))
		cancel()
		if err != nil || !c.ok(res) {
			t.Errorf("%s: %v %s %+v %+v stdout %.200q stderr %.200q", c.name, err, res.Status, res.Error, info, res.Stdout, res.Stderr)
		}
		t.Logf("%s: %s, interpreter ended %v", c.name, res.Status, info.Ended)
		res, _ = call(t, s, next, job.Limits{})
		mustSucceed(t, res, "42")
		res, _ = call(t, victim, probe, job.Limits{})
		mustSucceed(t, res, want)
		healthy(t, rt)
	}
}

// The hostile programs of hostile_test.go as calls of a session: each ends
// its call (or its interpreter) without harming the fleet, another
// tenant's session, or the session's own next call; nothing of one session
// is in another's view.
func TestSessionHostileCalls(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	victim := openSession(t, rt, "globex", 0)
	res, _ := call(t, victim, "x = 7\nopen('/work/secret.txt', 'w').write('globex')", job.Limits{})
	mustSucceed(t, res, "")
	s := openSession(t, rt, "acme", 0)
	hostileCalls(t, rt, s, victim, []hostileCall{
		{"fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", job.Limits{Pids: 32, TimeoutMS: 2000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut }},
		{"kill every process", "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded || r.Status == job.StatusFailed }},
		{"kill its init", "import os\nos.kill(1, 9)\nprint('alive')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded || r.Status == job.StatusFailed }},
		{"ignore the interrupt", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)", job.Limits{TimeoutMS: 1000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut }},
		{"CPU over all processes", "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True: pass", job.Limits{CPUMS: 1000, TimeoutMS: 20000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut || r.Status == job.StatusFailed }},
		{"output flood", "import sys\nb = b'x' * (1 << 20)\nfor _ in range(50): sys.stdout.buffer.write(b)", job.Limits{OutputBytes: 1 << 16},
			func(r job.Result) bool { return r.StdoutTruncated && int64(len(r.Stdout)) <= 1<<16 }},
		{"fill /tmp", "f = open('/tmp/f', 'wb')\nwhile True: f.write(b'x' * (1 << 20))", job.Limits{DiskMB: 16},
			func(r job.Result) bool { return r.Status == job.StatusFailed }},
		{"symlink out of /work", "import os\nos.symlink('/etc/passwd', '/work/evil')\nos.symlink('/', '/work/root')\nprint('planted')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded }},
		{"look for the other session", "import os\nprint(sorted(os.listdir('/work')), sorted(os.listdir('/run/kiln')), [p for p in os.listdir('/proc') if p.isdigit()])", job.Limits{},
			func(r job.Result) bool {
				return r.Status == job.StatusSucceeded && !strings.Contains(r.Stdout, "secret")
			}},
	}, "print(6 * 7)", "print(x, open('/work/secret.txt').read())", "7 globex")
	// The checkpoint's walk never follows the planted links.
	err := s.WalkFiles(func(f SessionFile, open func() (*os.File, error)) error {
		if f.Name == "evil" || strings.HasPrefix(f.Name, "root") {
			t.Errorf("the walk reported %s", f.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutFile("evil", []byte("over"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/etc/passwd"); err != nil || strings.Contains(string(b), "over") {
		t.Fatalf("PutFile followed a symlink: %v", err)
	}
}
