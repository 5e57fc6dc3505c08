package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// setupNodeSessions is setupSessions with the node image this tree's recipe
// builds beside the python one.
func setupNodeSessions(t *testing.T) *Containerd {
	t.Helper()
	return setupSessionsWith(t, func(c *Config) {
		c.Images["node"] = "kiln.local/node:" + recipeHash(t, "node")[:12]
		c.Isolation = testIsolationOverride(c.Images)
	})
}

// openNodeSession opens a node session of tenant, closed with the test.
func openNodeSession(t *testing.T, rt *Containerd, tenant string) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := rt.openSession(ctx, SessionOptions{ID: job.NewID(), Tenant: tenant, Runtime: "node"})
	if err != nil {
		t.Fatalf("OpenSession node: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// outputText is the text/plain of res's execute_result ("" without one).
func outputText(res job.Result) string {
	for _, o := range res.Outputs {
		if o.Type == "execute_result" {
			return string(o.Data["text/plain"])
		}
	}
	return ""
}

// A node session keeps globalThis, declarations, required modules and files
// between calls; a call's value, an exception, process.exit, top-level
// await and an interrupt each end the call alone, the interpreter kept.
func TestNodeSessionKeepsState(t *testing.T) {
	t.Parallel()
	rt := setupNodeSessions(t)
	s := openNodeSession(t, rt, "acme")
	res, info := call(t, s, "globalThis.x = 41\nvar y = 1\nconst fs = require('fs')\nconst path = require('path')\nfs.writeFileSync('a.txt', 'hi')\nconsole.log('one')", job.Limits{})
	mustSucceed(t, res, "one")
	if !info.Fresh {
		t.Errorf("the first call did not start the interpreter: %+v", info)
	}
	res, info = call(t, s, "console.log(x + y, fs.readFileSync('a.txt', 'utf8'), typeof path.join, process.cwd())", job.Limits{})
	mustSucceed(t, res, "42 hi function /work")
	if info.Fresh || info.Ended {
		t.Errorf("the second call did not find the interpreter: %+v", info)
	}
	res, _ = call(t, s, "x * 2", job.Limits{})
	mustSucceed(t, res, "")
	if got := outputText(res); got != `"82"` {
		t.Errorf("the call's value: %q (outputs %+v)", got, res.Outputs)
	}
	res, _ = call(t, s, "function boom() { throw new TypeError('bad ' + x) }\nboom()", job.Limits{})
	if res.Status != job.StatusFailed || res.Error == nil || res.Error.Exception == nil {
		t.Errorf("a thrown error: %s %+v stderr %q", res.Status, res.Error, res.Stderr)
	} else if e := res.Error.Exception; e.Type != "TypeError" || e.Message != "bad 41" || e.Line != 1 || !strings.Contains(res.Stderr, "TypeError: bad 41") {
		t.Errorf("a thrown error: %+v stderr %q", e, res.Stderr)
	}
	res, _ = call(t, s, "console.log('before'); process.exit(3)", job.Limits{})
	if res.Status != job.StatusFailed || res.ExitCode == nil || *res.ExitCode != 3 || strings.TrimSpace(res.Stdout) != "before" {
		t.Errorf("process.exit(3): %s exit %v stdout %q", res.Status, res.ExitCode, res.Stdout)
	}
	res, _ = call(t, s, "const v = await new Promise((r) => setTimeout(() => r(x), 50))\nglobalThis.z = v + 1\nconsole.log(v)", job.Limits{})
	mustSucceed(t, res, "41")
	res, _ = call(t, s, "new Promise((r) => setTimeout(() => r(z), 10))", job.Limits{})
	if got := outputText(res); res.Status != job.StatusSucceeded || got != `"42"` {
		t.Errorf("a promise's value: %s %q", res.Status, got)
	}
	// A loop the call never leaves is interrupted where it runs.
	res, info = call(t, s, "while (true) {}", job.Limits{TimeoutMS: 1000})
	if res.Status != job.StatusTimedOut || info.Ended {
		t.Errorf("an endless loop: %s %+v", res.Status, info)
	}
	// So is a call awaiting what never comes.
	res, info = call(t, s, "await new Promise(() => {})", job.Limits{TimeoutMS: 1000})
	if res.Status != job.StatusTimedOut || info.Ended {
		t.Errorf("an endless await: %s %+v", res.Status, info)
	}
	res, _ = call(t, s, "console.log(x, z, y)", job.Limits{})
	mustSucceed(t, res, "41 42 1")
	// A later call may declare a name again, as in a console.
	res, _ = call(t, s, "const fs = require('fs')\nlet y2 = 2\nconsole.log(typeof fs.statSync, v)", job.Limits{})
	mustSucceed(t, res, "function 41")
	// Its environment is the call's.
	base := Request{Tenant: "acme"}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, _, err := s.Exec(ctx, asRun(base, job.NewID(), job.Spec{Code: "console.log(process.env.GREETING, process.getuid() !== 0)", Env: map[string]string{"GREETING": "hello"}}))
	if err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, res, "hello true")
	// The interpreter has the session's identity and no privilege: its own
	// uid, no capabilities, no_new_privs, the job seccomp filter.
	res, _ = call(t, s, "console.log(JSON.stringify(Object.fromEntries(require('fs').readFileSync('/proc/self/status', 'utf8').split('\\n').map((l) => l.split(':\\t')).filter((kv) => kv.length === 2))))", job.Limits{})
	var st map[string]string
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
		t.Fatalf("status: %v %q", err, res.Stdout)
	}
	check := func(what string, ok bool, v any) {
		if !ok {
			t.Errorf("node session interpreter: %s: %v", what, v)
		}
	}
	checkNoPrivilege(check, st["NoNewPrivs"], map[string]string{"CapEff": st["CapEff"], "CapPrm": st["CapPrm"], "CapBnd": st["CapBnd"], "CapInh": st["CapInh"], "CapAmb": st["CapAmb"]})
	check("Seccomp filter", st["Seccomp"] == "2", st["Seccomp"])
	check("uid not root", !strings.HasPrefix(st["Uid"], "0\t"), st["Uid"])
}

// Hostile calls in a node session end their call (or the interpreter)
// without harming the fleet, another tenant's node session, or the
// session's next call.
func TestNodeSessionHostileCalls(t *testing.T) {
	t.Parallel()
	rt := setupNodeSessions(t)
	victim := openNodeSession(t, rt, "globex")
	res, _ := call(t, victim, "globalThis.x = 7\nrequire('fs').writeFileSync('/work/secret.txt', 'globex')", job.Limits{})
	mustSucceed(t, res, "")
	s := openNodeSession(t, rt, "acme")
	hostileCalls(t, rt, s, victim, []hostileCall{
		{"fork bomb", "const { spawn } = require('child_process')\nconst bomb = () => { spawn('sh', ['-c', 'sleep 30']).on('error', () => {}); setImmediate(bomb) }\nbomb()\nawait new Promise(() => {})", job.Limits{Pids: 32, TimeoutMS: 2000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut }},
		{"heap bomb", "const a = []\nfor (;;) a.push(new Array(1 << 20).fill(1.5))", job.Limits{TimeoutMS: 20000},
			func(r job.Result) bool { return r.Status == job.StatusFailed }},
		{"kill every process", "process.kill(-1, 'SIGKILL')\nconsole.log('alive')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded || r.Status == job.StatusFailed }},
		{"kill its init", "process.kill(1, 'SIGKILL')\nconsole.log('alive')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded || r.Status == job.StatusFailed }},
		{"ignore the interrupt", "process.removeAllListeners('SIGINT')\nprocess.on('SIGINT', () => {})\n;(async () => { for (;;) await null })()\nawait new Promise(() => {})", job.Limits{TimeoutMS: 1000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut }},
		{"CPU over all processes", "const { spawn } = require('child_process')\nfor (let i = 0; i < 3; i++) spawn('sh', ['-c', 'while :; do :; done'])\nfor (;;) {}", job.Limits{CPUMS: 1000, TimeoutMS: 20000},
			func(r job.Result) bool { return r.Status == job.StatusTimedOut || r.Status == job.StatusFailed }},
		{"output flood", "const b = 'x'.repeat(1 << 20)\nfor (let i = 0; i < 50; i++) process.stdout.write(b)", job.Limits{OutputBytes: 1 << 16},
			func(r job.Result) bool { return r.StdoutTruncated && int64(len(r.Stdout)) <= 1<<16 }},
		{"fill /tmp", "const fs = require('fs')\nconst fd = fs.openSync('/tmp/f', 'w')\nfor (;;) fs.writeSync(fd, Buffer.alloc(1 << 20))", job.Limits{DiskMB: 16},
			func(r job.Result) bool { return r.Status == job.StatusFailed }},
		{"symlink out of /work", "const fs = require('fs')\nfs.symlinkSync('/etc/passwd', '/work/evil')\nfs.symlinkSync('/', '/work/root')\nconsole.log('planted')", job.Limits{},
			func(r job.Result) bool { return r.Status == job.StatusSucceeded }},
		{"look for the other session", "const fs = require('fs')\nconsole.log(fs.readdirSync('/work'), fs.readdirSync('/proc').filter((p) => /^[0-9]+$/.test(p)), process.getuid())", job.Limits{},
			func(r job.Result) bool {
				return r.Status == job.StatusSucceeded && !strings.Contains(r.Stdout, "secret")
			}},
	}, "console.log(6 * 7)", "console.log(x, require('fs').readFileSync('/work/secret.txt', 'utf8'))", "7 globex")
	if err := s.PutFile("evil", []byte("over"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/etc/passwd"); err != nil || strings.Contains(string(b), "over") {
		t.Fatalf("PutFile followed a symlink: %v", err)
	}
}
