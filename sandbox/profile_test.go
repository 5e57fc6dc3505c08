package sandbox

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// probe runs inside the sandbox and reports what a program can see and do.
const probe = `
import json, os, socket, sys
out = {}
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ("Seccomp", "CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs"):
    out[k] = status.get(k, "").strip()
out["uid"], out["gid"], out["groups"] = os.getuid(), os.getgid(), os.getgroups()
out["cwd"], out["hostname"] = os.getcwd(), socket.gethostname()
out["work_owner"] = os.stat("/work").st_uid
def try_write(path, n):
    written = 0
    try:
        with open(path, "wb") as f:
            chunk = b"x" * (1 << 20)
            while written < n:
                f.write(chunk); f.flush(); written += len(chunk)
        return "ok %d" % written
    except OSError as e:
        return "%s after %d" % (e.__class__.__name__ if e.errno is None else os.strerror(e.errno), written)
out["root_write"] = try_write("/kiln-probe", 1)
out["usr_write"] = try_write("/usr/kiln-probe", 1)
out["tmp_small"] = try_write("/tmp/small", 2 << 20)
out["tmp_big"] = try_write("/tmp/big", 64 << 20)
out["work_write"] = try_write("/work/w", 1 << 20)
out["net_ifaces"] = sorted(os.listdir("/sys/class/net"))
def connect(host, port):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port)); return "connected"
    except OSError as e:
        return "failed: %s" % e
    finally:
        s.close()
out["connect_outside"] = connect("1.1.1.1", 53)
out["connect_host"] = connect("127.0.0.1", int(sys.argv[1]))
out["env"] = dict(os.environ)
try:
    out["canary"] = open(sys.argv[2]).read()
except OSError as e:
    out["canary"] = "unreadable: %s" % e.__class__.__name__
out["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(out))
`

// TestSandboxProfile checks the sandbox from the inside: seccomp, no
// capabilities, no_new_privs, the sandbox user, a read-only root, capped
// writable tmpfs, loopback only and no route out (neither to the internet nor
// to a service on the host's loopback), the environment allowlist, and no
// view of host files.
func TestSandboxProfile(t *testing.T) {
	t.Parallel()
	rt := setup(t)

	// A host service on 127.0.0.1: a sandbox sharing the host's network would reach it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	// A host file outside the image.
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}

	spec := py(probe)
	spec.Args = []string{fmt.Sprint(ln.Addr().(*net.TCPAddr).Port), canary}
	spec.Env = map[string]string{"JOB_VAR": "from spec"}
	spec.Limits = job.Limits{DiskMB: 8}
	res := run(t, rt, spec)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("probe: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	var got struct {
		Seccomp, CapEff, CapPrm, CapBnd, CapInh, CapAmb, NoNewPrivs string
		UID                                                         int `json:"uid"`
		GID                                                         int `json:"gid"`
		Groups                                                      []int
		Cwd, Hostname                                               string
		WorkOwner                                                   int      `json:"work_owner"`
		RootWrite                                                   string   `json:"root_write"`
		UsrWrite                                                    string   `json:"usr_write"`
		TmpSmall                                                    string   `json:"tmp_small"`
		TmpBig                                                      string   `json:"tmp_big"`
		WorkWrite                                                   string   `json:"work_write"`
		NetIfaces                                                   []string `json:"net_ifaces"`
		ConnectOutside                                              string   `json:"connect_outside"`
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
	inRange := got.UID >= rt.cfg.UIDStart && got.UID < rt.cfg.UIDStart+rt.cfg.UIDCount
	if testBox() && !underGVisor() {
		// A box job's uid inside the box's user namespace.
		inRange = got.UID >= boxJobUIDMin && got.UID < boxJobUIDMax
	}
	check("uid from the sandbox range", inRange, got.UID)
	check("gid equal to the uid", got.GID == got.UID, got.GID)
	check("no supplementary groups beyond its own", len(got.Groups) == 0 || slices.Equal(got.Groups, []int{got.UID}), got.Groups)
	check("cwd /work", got.Cwd == "/work", got.Cwd)
	check("hostname kiln", got.Hostname == "kiln", got.Hostname)
	check("/work owned by the sandbox uid", got.WorkOwner == got.UID, got.WorkOwner)
	// gVisor checks the directory's permissions before the mount's
	// read-only flag and answers EACCES; nothing is written either way.
	readOnly := func(s string) bool {
		return strings.HasPrefix(s, "Read-only file system") || underGVisor() && strings.HasPrefix(s, "Permission denied after 0")
	}
	check("root fs read-only", readOnly(got.RootWrite), got.RootWrite)
	check("/usr read-only", readOnly(got.UsrWrite), got.UsrWrite)
	check("/tmp writable", got.TmpSmall == "ok 2097152", got.TmpSmall)
	// 8 MiB cap, 2 MiB already used by /tmp/small: stopped at the cap
	// (ENOSPC from the tmpfs, or EFBIG from RLIMIT_FSIZE, whichever first).
	check("/tmp stops at its cap", (strings.HasPrefix(got.TmpBig, "No space left on device") || strings.HasPrefix(got.TmpBig, "File too large")) &&
		!strings.Contains(got.TmpBig, "after 8388608"), got.TmpBig)
	check("/work writable", got.WorkWrite == "ok 1048576", got.WorkWrite)
	check("only lo", slices.Equal(got.NetIfaces, []string{"lo"}), got.NetIfaces)
	check("no route outside", strings.HasPrefix(got.ConnectOutside, "failed"), got.ConnectOutside)
	check("host loopback service unreachable", strings.HasPrefix(got.ConnectHost, "failed"), got.ConnectHost)
	check("host listener saw no connection", accepted.Load() == 0, accepted.Load())
	check("host canary unreadable", strings.HasPrefix(got.Canary, "unreadable"), got.Canary)
	check(onlyItsOwnWant(), onlyItsOwnProcs(got.Procs), got.Procs)

	wantEnv := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
		"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "TMPDIR": "/tmp", "MPLCONFIGDIR": "/tmp", "MPLBACKEND": "Agg",
		"HOSTNAME": "kiln", "JOB_VAR": "from spec", "KILN_OUTPUT_DIR": "/work/out", "OMP_NUM_THREADS": "1",
	}
	for k, v := range got.Env {
		if k == "LC_CTYPE" {
			continue // set by Python itself at start-up (PEP 538 locale coercion), not by the sandbox
		}
		if wantEnv[k] != v {
			t.Errorf("env %s=%q is not in the allowlist (or has the wrong value)", k, v)
		}
	}
	for k := range wantEnv {
		if _, ok := got.Env[k]; !ok {
			t.Errorf("env %s missing", k)
		}
	}
	healthy(t, rt)
}

// The interpreter starts with no user site and a safe sys.path, and with the
// sandbox's PYTHONHASHSEED=0 in force: str hashes, and so set order, are the
// same on every run, which the result cache relies on.
func TestInterpreterFlagsAndStableHashes(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	code := `import sys
f = sys.flags
print(f.no_user_site, f.safe_path, f.ignore_environment, f.hash_randomization, f.dont_write_bytecode)
print(hash("kiln"), sorted(set("kiln sandbox")) == list(sorted(set("kiln sandbox"))), list({"alpha", "beta", "gamma", "delta"}))`
	var first string
	for i := range 2 {
		res, err := rt.Run(t.Context(), Request{ID: job.NewID(), Spec: py(code)})
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("run %d: %v %+v\n%s", i, err, res.Error, res.Stderr)
		}
		lines := strings.SplitN(res.Stdout, "\n", 2)
		if lines[0] != "1 True 0 0 1" {
			t.Fatalf("sys.flags no_user_site safe_path ignore_environment hash_randomization dont_write_bytecode = %q; want 1 True 0 0 1", lines[0])
		}
		if i == 0 {
			first = res.Stdout
		} else if res.Stdout != first {
			t.Fatalf("hashes differ between runs:\n%s\n%s", first, res.Stdout)
		}
	}
}

// checkNoPrivilege checks a probe's /proc/self/status: every capability set
// empty and no_new_privs. gVisor's (runsc 2022) has no CapAmb and no
// NoNewPrivs line; the four sets it shows must still be empty.
func checkNoPrivilege(check func(what string, ok bool, v any), noNewPrivs string, caps map[string]string) {
	if underGVisor() {
		delete(caps, "CapAmb")
	} else {
		check("NoNewPrivs", noNewPrivs == "1", noNewPrivs)
	}
	for name, v := range caps {
		check(name+" empty", v == "0000000000000000", v)
	}
}
