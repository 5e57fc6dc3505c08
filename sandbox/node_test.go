package sandbox

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func js(code string) job.Spec { return job.Spec{Runtime: "node", Code: code} }

// nodeProbe is the sandbox profile probe, written in JS.
const nodeProbe = `
const fs = require('fs'), os = require('os'), net = require('net');
const out = {};
const status = Object.fromEntries(fs.readFileSync('/proc/self/status', 'utf8').split('\n').filter(l => l.includes(':\t')).map(l => l.split(':\t')).map(([k, v]) => [k, v.trim()]));
for (const k of ['Seccomp', 'CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb', 'NoNewPrivs']) out[k] = status[k];
out.uid = process.getuid(); out.gid = process.getgid(); out.cwd = process.cwd(); out.hostname = os.hostname();
const tryWrite = (p) => { try { fs.writeFileSync(p, 'x'); return 'ok'; } catch (e) { return e.code; } };
out.root_write = tryWrite('/kiln-probe'); out.usr_write = tryWrite('/usr/kiln-probe');
out.tmp_write = tryWrite('/tmp/p'); out.work_write = tryWrite('/work/p');
out.net_ifaces = fs.readdirSync('/sys/class/net').sort();
out.env = process.env;
try { out.canary = fs.readFileSync(process.argv[3], 'utf8'); } catch (e) { out.canary = 'unreadable: ' + e.code; }
out.procs = fs.readdirSync('/proc').filter(p => /^\d+$/.test(p)).map(Number).sort((a, b) => a - b);
const s = net.connect({ host: '127.0.0.1', port: Number(process.argv[2]) });
s.setTimeout(3000, () => { s.destroy(); out.connect_host = 'failed: timeout'; console.log(JSON.stringify(out)); });
s.on('connect', () => { out.connect_host = 'connected'; s.destroy(); console.log(JSON.stringify(out)); });
s.on('error', (e) => { out.connect_host = 'failed: ' + e.code; console.log(JSON.stringify(out)); });
`

// TestNodeSandboxProfile checks the sandbox from inside node: the same
// profile as python's (uid, no capabilities, read-only root, loopback only,
// the environment allowlist, no host files).
func TestNodeSandboxProfile(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := js(nodeProbe)
	spec.Args = []string{fmt.Sprint(ln.Addr().(*net.TCPAddr).Port), canary}
	spec.Env = map[string]string{"JOB_VAR": "from spec"}
	res := run(t, rt, spec)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("probe: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	var got struct {
		Seccomp, CapEff, CapPrm, CapBnd, CapInh, CapAmb, NoNewPrivs string
		UID                                                         int `json:"uid"`
		Cwd, Hostname                                               string
		RootWrite                                                   string   `json:"root_write"`
		UsrWrite                                                    string   `json:"usr_write"`
		TmpWrite                                                    string   `json:"tmp_write"`
		WorkWrite                                                   string   `json:"work_write"`
		NetIfaces                                                   []string `json:"net_ifaces"`
		ConnectHost                                                 string   `json:"connect_host"`
		Env                                                         map[string]string
		Canary                                                      string
		Procs                                                       []int
	}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, res.Stdout)
	}
	t.Logf("probe: %+v", got)
	check := func(what string, ok bool, v any) {
		t.Helper()
		if !ok {
			t.Errorf("%s: got %v", what, v)
		}
	}
	check("Seccomp filter mode (2)", got.Seccomp == "2", got.Seccomp)
	checkNoPrivilege(check, got.NoNewPrivs, map[string]string{"CapEff": got.CapEff, "CapPrm": got.CapPrm, "CapBnd": got.CapBnd, "CapInh": got.CapInh, "CapAmb": got.CapAmb})
	check("uid from the sandbox range", got.UID >= rt.cfg.UIDStart && got.UID < rt.cfg.UIDStart+rt.cfg.UIDCount, got.UID)
	check("cwd /work", got.Cwd == "/work", got.Cwd)
	check("hostname kiln", got.Hostname == "kiln", got.Hostname)
	// gVisor checks the directory's permissions before the mount's
	// read-only flag and answers EACCES; nothing is written either way.
	readOnly := func(code string) bool { return code == "EROFS" || underGVisor() && code == "EACCES" }
	check("root read-only", readOnly(got.RootWrite), got.RootWrite)
	check("/usr read-only", readOnly(got.UsrWrite), got.UsrWrite)
	check("/tmp writable", got.TmpWrite == "ok", got.TmpWrite)
	check("/work writable", got.WorkWrite == "ok", got.WorkWrite)
	check("only lo", slices.Equal(got.NetIfaces, []string{"lo"}), got.NetIfaces)
	check("host loopback service unreachable", strings.HasPrefix(got.ConnectHost, "failed"), got.ConnectHost)
	check("host canary unreadable", strings.HasPrefix(got.Canary, "unreadable"), got.Canary)
	if underGVisor() {
		// A pid namespace of the job's own: its launcher is pid 1.
		check("only its own process (pid 1 of its own pid namespace)", slices.Equal(got.Procs, []int{1}), got.Procs)
	} else {
		check("only kiln-init and its own process", len(got.Procs) == 2 && got.Procs[0] == 1, got.Procs)
	}
	wantEnv := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
		"TMPDIR": "/tmp", "HOSTNAME": "kiln", "NODE_DISABLE_COLORS": "1", "NO_UPDATE_NOTIFIER": "1", "JOB_VAR": "from spec", "OMP_NUM_THREADS": "1",
		"KILN_OUTPUT_DIR": "/work/out",
	}
	if !mapsEqual(got.Env, wantEnv) {
		t.Errorf("env %v; want exactly %v", got.Env, wantEnv)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestNodePrograms runs ordinary JS programs through the whole contract:
// stdin, args, env, input files, exit codes, ES modules, and failures with
// the right status and category.
func TestNodePrograms(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	tests := []struct {
		name     string
		spec     job.Spec
		status   job.Status
		category job.Category
		stdout   string // exact, for a success
		msg      string // in the failure's message
	}{
		{"hello with args stdin env files", job.Spec{Runtime: "node", Args: []string{"a", "b"}, Stdin: "in\n", Env: map[string]string{"X": "y"},
			Files: []job.File{{Name: "data/n.json", Content: `{"n": 41}`}},
			Code: `const fs = require('fs');
const n = JSON.parse(fs.readFileSync('data/n.json', 'utf8')).n + 1;
console.log(process.argv.slice(2).join(','), fs.readFileSync(0, 'utf8').trim(), process.env.X, n, require.main === module, __filename);`},
			job.StatusSucceeded, "", "a,b in y 42 true /work/main.js\n", ""},
		{"async stdin stream", js(`let s = ''; process.stdin.on('data', d => s += d).on('end', () => console.log(s.split('\n').filter(Boolean).map(Number).reduce((a, b) => a + b)));`),
			job.StatusSucceeded, "", "", ""},
		{"ES module with top-level await", js("import { readFileSync } from 'fs';\nconst v = await Promise.resolve(7);\nconsole.log(v, typeof readFileSync, import.meta.url);"),
			job.StatusSucceeded, "", "7 function file:///work/main.mjs\n", ""},
		{"exit code", js("console.log('bye'); process.exit(3);"), job.StatusFailed, job.CategoryRuntimeError, "bye\n", "code 3"},
		{"syntax error", js("console.log('x'\nlet = ;"), job.StatusFailed, job.CategorySyntaxError, "", "SyntaxError"},
		{"uncaught exception", js("function f() { throw new RangeError('too far'); }\nf();"), job.StatusFailed, job.CategoryRuntimeError, "", "RangeError: too far (main.js:1)"},
		{"unhandled rejection", js("Promise.reject(new TypeError('nope'));"), job.StatusFailed, job.CategoryRuntimeError, "", "TypeError: nope"},
		{"missing module", js("const _ = require('lodash');"), job.StatusFailed, job.CategoryRuntimeError, "", `module "lodash" is not installed in the node runtime's image`},
		{"missing ES package", js("import left from 'left-pad';"), job.StatusFailed, job.CategoryRuntimeError, "", `module "left-pad" is not installed`},
		{"BOM is stripped as node does", js("\ufeffconsole.log('bom ok');"), job.StatusSucceeded, "", "bom ok\n", ""},
		{"json, crypto, zlib", js(`const c = require('crypto'), z = require('zlib');
console.log(c.createHash('sha256').update('kiln').digest('hex').slice(0, 8), z.gunzipSync(z.gzipSync('abc')).toString(), JSON.stringify({a: [1, 2]}));`),
			job.StatusSucceeded, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := tt.spec
			if tt.name == "async stdin stream" {
				spec.Stdin = "1\n2\n3\n"
				tt.stdout = "6\n"
			}
			if tt.name == "json, crypto, zlib" {
				tt.stdout = "" // checked below
			}
			res := run(t, rt, spec)
			if tt.status == job.StatusSucceeded {
				if tt.stdout == "" {
					if res.Status != job.StatusSucceeded {
						t.Fatalf("got %s %+v\n%s", res.Status, res.Error, res.Stderr)
					}
					t.Logf("stdout %q", res.Stdout)
					return
				}
				requireSucceeded(t, res, tt.stdout)
				return
			}
			requireFailed(t, res, tt.status, tt.category, tt.msg)
			if tt.stdout != "" && res.Stdout != tt.stdout {
				t.Errorf("stdout %q; want %q", res.Stdout, tt.stdout)
			}
		})
	}
}

// TestNodeHostile runs the hostile programs that make sense in JS.
func TestNodeHostile(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	t.Run("infinite loop", func(t *testing.T) {
		spec := js("for (;;) {}")
		spec.Limits.TimeoutMS = 1500
		requireFailed(t, run(t, rt, spec), job.StatusTimedOut, job.CategoryTimeout, "wall-clock")
	})
	t.Run("allocation bomb", func(t *testing.T) {
		spec := js("const a = []; for (;;) a.push(new Array(1e6).fill(Math.random()));")
		spec.Limits.MemoryMB = 128
		spec.Limits.TimeoutMS = 60_000
		res := run(t, rt, spec)
		// V8's heap bound (a share of the memory limit) ends it first; the
		// kernel's OOM killer is the backstop. Either way: not a timeout.
		// V8 aborting at its own heap bound is a failed run whose message
		// says so (stderr may refine a message, never a status); the cgroup's
		// OOM kill is oom_killed.
		oom := res.Status == job.StatusOOMKilled && res.Error != nil && res.Error.Category == job.CategoryMemoryLimit
		heap := res.Status == job.StatusFailed && res.Error != nil && res.Error.Category == job.CategoryRuntimeError && strings.Contains(res.Error.Message, "heap")
		if !oom && !heap {
			t.Fatalf("got %s %+v (exit %d, signal %q, peak %d, wall %d ms)\n%s", res.Status, res.Error, res.Code(), res.Signal, res.MemoryPeakBytes, res.WallMS, tailOf(res.Stderr))
		}
		t.Logf("allocation bomb: %s signal %q after %d ms, peak %d", res.Status, res.Signal, res.WallMS, res.MemoryPeakBytes)
	})
	t.Run("buffer bomb outside the V8 heap", func(t *testing.T) {
		spec := js("const a = []; for (;;) a.push(Buffer.alloc(16 << 20, 1));")
		spec.Limits.MemoryMB = 128
		spec.Limits.TimeoutMS = 60_000
		requireFailed(t, run(t, rt, spec), job.StatusOOMKilled, job.CategoryMemoryLimit, "out of memory")
	})
	t.Run("fork bomb via child_process", func(t *testing.T) {
		spec := js(`const { spawn } = require('child_process');
let ok = 0, refused = 0;
function more() { try { const c = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)']); c.on('error', () => refused++); ok++; } catch (e) { refused++; } }
const t = setInterval(() => { for (let i = 0; i < 8; i++) more(); if (refused > 0) { console.log('refused'); clearInterval(t); process.exit(0); } }, 10);`)
		spec.Limits = job.Limits{Pids: 32, TimeoutMS: 20_000}
		res := run(t, rt, spec)
		// Under gVisor the sandbox's own kernel needs threads of the same
		// pids bound: the bomb ends the sandbox, judged the program's
		// failure at its limit (never the platform's, never retried).
		atLimit := underGVisor() && res.Status == job.StatusFailed && res.Error != nil && res.Error.Category == job.CategoryRuntimeError &&
			!res.Error.Retryable && strings.Contains(res.Error.Message, "limit of processes")
		if !atLimit && (res.Status == job.StatusSucceeded && res.Stdout != "refused\n" || res.Status != job.StatusSucceeded && res.Status != job.StatusTimedOut && res.Status != job.StatusOOMKilled) {
			t.Fatalf("got %s %+v stdout %q\n%s", res.Status, res.Error, res.Stdout, tailOf(res.Stderr))
		}
		t.Logf("fork bomb: %s stdout %q", res.Status, res.Stdout)
	})
	t.Run("output flood", func(t *testing.T) {
		spec := js("const b = 'x'.repeat(1 << 20) + '\\n'; for (let i = 0; i < 40; i++) process.stdout.write(b);")
		spec.Limits.TimeoutMS = 60_000
		res := run(t, rt, spec)
		if res.Status != job.StatusSucceeded || !res.StdoutTruncated || res.StdoutBytes != 40*((1<<20)+1) || int64(len(res.Stdout)) != res.Limits.OutputBytes {
			t.Fatalf("got %s, kept %d of %d bytes, truncated %v", res.Status, len(res.Stdout), res.StdoutBytes, res.StdoutTruncated)
		}
	})
	t.Run("filling /tmp", func(t *testing.T) {
		spec := js(`const fs = require('fs'); const b = Buffer.alloc(1 << 20); let n = 0;
try { const fd = fs.openSync('/tmp/fill', 'w'); for (;;) { fs.writeSync(fd, b); n++; } } catch (e) { console.log(e.code, n < 8); }`)
		spec.Limits.DiskMB = 4
		// Stopped at the cap: ENOSPC from the tmpfs, or EFBIG from
		// RLIMIT_FSIZE (the same size), whichever comes first.
		res := run(t, rt, spec)
		if res.Status != job.StatusSucceeded || (res.Stdout != "ENOSPC true\n" && res.Stdout != "EFBIG true\n") {
			t.Fatalf("got %s %+v stdout %q; want ENOSPC or EFBIG before 8 MiB\n%s", res.Status, res.Error, res.Stdout, tailOf(res.Stderr))
		}
	})
	t.Run("network refused", func(t *testing.T) {
		res := run(t, rt, js(`const net = require('net');
const s = net.connect({ host: '10.255.255.1', port: 80 });
s.setTimeout(3000, () => { console.log('timeout'); process.exit(0); });
s.on('error', e => console.log('refused', e.code));`))
		// No route out: gVisor's netstack says EHOSTUNREACH where Linux
		// says ENETUNREACH.
		if res.Status != job.StatusSucceeded || res.Stdout != "refused ENETUNREACH\n" && !(underGVisor() && res.Stdout == "refused EHOSTUNREACH\n") {
			t.Fatalf("got %s %+v stdout %q; want refused ENETUNREACH", res.Status, res.Error, res.Stdout)
		}
	})
}

func tailOf(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}
