package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// leaveBehind is a job that leaves everything a job can leave: files (a
// chmod-000 tree, xattrs, old mtimes on /tmp and /work themselves),
// processes (double-forked, setsid, stopped, traced), IPC of both kinds,
// abstract and path unix sockets, its environment and a patched module, and
// its secrets (code, stdin, args, env, an input file) in its memory. Its
// last line names its box.
const leaveBehind = `
import os, sys, subprocess, ctypes, json, signal, socket, time
libc = ctypes.CDLL(None, use_errno=True)
SECRET_CODE = "kiln-secret-code-7f3a9c"
data = sys.stdin.read()
secret_file = open("input.txt").read()
keep = [SECRET_CODE * 3, data * 3, secret_file * 3, " ".join(sys.argv) * 3, os.environ["SECRET_ENV"] * 3]
for d in ("/tmp", "/work"):
    open(d + "/left", "w").write("x")
    os.makedirs(d + "/locked/deep", exist_ok=True)
    open(d + "/locked/deep/f", "w").write("x")
    os.chmod(d + "/locked/deep", 0)
    os.chmod(d + "/locked", 0)
    try:
        os.setxattr(d, "user.left", b"1")
    except OSError:
        pass
    try:
        os.utime(d, (1000000000, 1000000000))
    except OSError:
        pass  # /tmp is not the job's own
open("/dev/shm/left", "w").write("x")
subprocess.Popen(["sleep", "300"], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid(); time.sleep(300)
    os._exit(0)
stopped = subprocess.Popen(["sleep", "301"]); os.kill(stopped.pid, signal.SIGSTOP)
traced = subprocess.Popen(["sleep", "302"])
libc.ptrace(16, traced.pid, 0, 0)  # PTRACE_ATTACH
assert libc.shmget(0x4b494c4e, 4096, 0o1000 | 0o666) >= 0
assert libc.semget(0x4b494c4f, 1, 0o1000 | 0o666) >= 0
assert libc.msgget(0x4b494c50, 0o1000 | 0o666) >= 0
libc.mq_open.restype = ctypes.c_int
assert libc.mq_open(b"/kiln-left", 0o100 | 0o2, 0o666, None) >= 0
a = socket.socket(socket.AF_UNIX); a.bind("\0kiln-left"); a.listen()
p = socket.socket(socket.AF_UNIX); p.bind("/tmp/kiln-left.sock"); p.listen()
os.environ["LEFT"] = "1"
json.dumps = lambda *a, **k: "patched"
print(os.stat("/work").st_dev)
`

// lookForLeftovers reports, as a JSON list, what of leaveBehind the job
// finds, its own memory included: the secrets' bytes anywhere but in the two
// buffers it searches with. The secrets arrive XOR-ed so that its own code
// does not hold them. Its last line names its box.
const lookForLeftovers = `
import os, sys, json, ctypes, socket
seen = []
for p in ("/tmp/left", "/tmp/locked", "/work/left", "/work/locked", "/dev/shm/left", "/dev/mqueue/kiln-left", "/tmp/kiln-left.sock"):
    if os.path.lexists(p): seen.append(p)
for d in ("/tmp", "/work"):
    if os.listxattr(d): seen.append("xattr " + d)
    if os.stat(d).st_mtime < 1500000000: seen.append("old mtime " + d)
for kind in ("shm", "sem", "msg"):
    if open("/proc/sysvipc/" + kind).read().splitlines()[1:]: seen.append("sysv " + kind)
procs = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
if procs: seen.append("processes %s" % procs)
try:
    s = socket.socket(socket.AF_UNIX); s.connect("\0kiln-left"); seen.append("abstract socket")
except OSError:
    pass
if "LEFT" in os.environ or "SECRET_ENV" in os.environ: seen.append("env")
if json.dumps({}) == "patched": seen.append("module")
buf = bytearray(1 << 20)
buf_at = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
mem = os.open("/proc/self/mem", os.O_RDONLY)
for enc in sys.argv[1:]:
    pat = bytearray(bytes.fromhex(enc))
    for i in range(len(pat)): pat[i] ^= 0x5A
    pat_at = ctypes.addressof((ctypes.c_char * len(pat)).from_buffer(pat))
    for line in open("/proc/self/maps").read().splitlines():
        f = line.split()
        if "r" not in f[1] or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]")): continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        at = lo
        while at < hi:
            n = min(len(buf), hi - at)
            try:
                got = os.preadv(mem, [memoryview(buf)[:n]], at)
            except OSError:
                break
            i = buf.find(pat, 0, got)
            while i >= 0:
                addr = at + i
                if not (buf_at <= addr < buf_at + len(buf) or pat_at <= addr < pat_at + len(pat)):
                    seen.append("secret %s at %x in %s" % (bytes(pat)[:12], addr, f[-1] if len(f) > 5 else "anon"))
                    break
                i = buf.find(pat, i + 1, got)
            at += max(n - len(pat), 1) if got == n else hi
print(json.dumps(seen))
print(os.stat("/work").st_dev)
`

func xorHex(s string) string {
	b := []byte(s)
	for i := range b {
		b[i] ^= 0x5A
	}
	return fmt.Sprintf("%x", b)
}

// Consecutive jobs in one box see nothing of each other: job 1 leaves
// everything a job can leave behind, job 2 of the same tenant, in the same
// box, finds none of it, not even job 1's secrets in its own memory.
func TestBoxJobsSeeNothingOfEachOther(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	// Preloaded modules, as in production: forked jobs share their pages.
	secrets := map[string]string{"code": "kiln-secret-code-7f3a9c", "stdin": "kiln-secret-stdin-51be0d",
		"file": "kiln-secret-file-c4d2e8", "arg": "kiln-secret-arg-9a0b6f", "env": "kiln-secret-env-3e7d21"}
	dirty := job.Spec{Runtime: "python", Code: leaveBehind, Stdin: secrets["stdin"], Args: []string{secrets["arg"]},
		Env:   map[string]string{"SECRET_ENV": secrets["env"]},
		Files: []job.File{{Name: "input.txt", Content: secrets["file"]}}}
	res := runAs(t, rt, "acme", dirty)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("the dirty job: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	dirtyIn := strings.TrimSpace(res.Stdout)
	check := py(lookForLeftovers)
	for _, s := range secrets {
		check.Args = append(check.Args, xorHex(s))
	}
	// Another tenant's job, in the same box: boxes serve every tenant.
	res = runAs(t, rt, "globex", check)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.Status != job.StatusSucceeded || len(lines) != 2 {
		t.Fatalf("the check job: %s %+v\n%s\n%s", res.Status, res.Error, res.Stdout, res.Stderr)
	}
	if lines[1] != dirtyIn {
		t.Fatalf("the check job ran in box %s, the dirty one in %s: not the same box", lines[1], dirtyIn)
	}
	if lines[0] != "[]" {
		t.Errorf("job 2 found what job 1 left: %s", lines[0])
	}
	// The box is healthy and serves the first tenant again.
	requireSucceeded(t, runAs(t, rt, "acme", py("print(6*7)")), "42\n")
}

// From a job, every process-directed call at every pid it can name fails,
// but for its own processes; and nothing it does to itself reaches the next
// job (rlimits, scheduling, a read-only /work).
func TestBoxSupervisorsUnreachable(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	attack := py(`
import os, ctypes, resource, signal, subprocess, json
libc = ctypes.CDLL(None, use_errno=True)
mine = subprocess.Popen(["sleep", "30"])
own = {mine.pid}
got = {}
def tally(name, ok):
    got.setdefault(name, []).append(ok)
for pid in range(1, 4 * 32768):
    if pid == os.getpid():
        continue
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        if pid != 1:  # the namespace's reaper is there, whatever kill says
            continue
    except PermissionError:
        pass
    for name, call in (
        ("kill", lambda: os.kill(pid, signal.SIGCONT)),
        ("prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, 8))),
        ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
        ("affinity", lambda: os.sched_setaffinity(pid, {0})),
        ("sched_idle", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
        ("ioprio", lambda: (_ for _ in ()).throw(OSError()) if libc.syscall(251, 1, pid, (3 << 13)) != 0 else None),
        ("ptrace", lambda: (_ for _ in ()).throw(OSError()) if libc.ptrace(16, pid, 0, 0) != 0 else None),
        ("oom_score_adj", lambda: open("/proc/%d/oom_score_adj" % pid, "w").write("-1000")),
        ("environ", lambda: open("/proc/%d/environ" % pid, "rb").read()),
        ("mem", lambda: open("/proc/%d/mem" % pid, "rb").read(1)),
    ):
        try:
            call(); ok = True
        except (OSError, ValueError):  # resource.prlimit says EPERM as ValueError
            ok = False
        tally(("own " if pid in own else "other ") + name, ok)
    if pid not in own:
        got.setdefault("others", []).append(pid)
# Damage the job could do to itself, which must not carry over.
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
os.setpriority(os.PRIO_PROCESS, 0, 19)
os.sched_setaffinity(0, {0})
os.chmod("/work", 0o555)
mine.kill()
print(json.dumps({k: sorted(set(v)) if k != "others" else v for k, v in got.items()}))
`)
	res := runAs(t, rt, "acme", attack)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("attack: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	var got map[string][]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &got); err != nil {
		t.Fatalf("%q: %v", res.Stdout, err)
	}
	t.Logf("%v", got)
	if others := got["others"]; len(others) != 1 || others[0] != float64(1) {
		t.Errorf("other processes the job can name: %v; want only its namespace's reaper, pid 1", others)
	}
	if len(got) < 20 {
		t.Errorf("calls tried: %v; want every call on its own process and on pid 1", got)
	}
	for k, v := range got {
		if strings.HasPrefix(k, "other ") && (len(v) != 1 || v[0] != false) {
			t.Errorf("%s on a process not the job's: %v; want refused", k, v)
		}
	}
	for _, k := range []string{"own kill", "own prlimit", "own setpriority", "own affinity"} {
		if v := got[k]; len(v) != 1 || v[0] != true {
			t.Errorf("%s: %v; want the job's own process its own to act on", k, v)
		}
	}
	// The next job is untouched.
	after := runAs(t, rt, "acme", py(`
import os, resource
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], os.getpriority(os.PRIO_PROCESS, 0), len(os.sched_getaffinity(0)) == os.cpu_count(), os.sched_getscheduler(0))
open("/work/w", "w").write("ok"); open("/tmp/t", "w").write("ok")
`))
	requireSucceeded(t, after, fmt.Sprintf("%d 0 True 0\n", ctrd.OpenFilesLimit))
}

// Every job forked from a preloaded zygote draws its own random numbers.
func TestBoxReseedsEveryGenerator(t *testing.T) {
	t.Parallel()
	if underGVisor() {
		t.Skip("gVisor runtimes run a container per job")
	}
	cfg := boxConfig(setupConfig(t))
	cfg.Pool.Preload = map[string][]string{"python": {"numpy", "random"}}
	rt := startRuntime(t, cfg)
	code := py("import random, numpy as np\nprint(random.random(), np.random.rand(), np.random.default_rng().random())")
	a := runAs(t, rt, "acme", code)
	b := runAs(t, rt, "acme", code)
	if a.Status != job.StatusSucceeded || b.Status != job.StatusSucceeded {
		t.Fatalf("%s %s\n%s%s", a.Status, b.Status, a.Stderr, b.Stderr)
	}
	fa, fb := strings.Fields(a.Stdout), strings.Fields(b.Stdout)
	for i := range fa {
		if fa[i] == fb[i] {
			t.Errorf("generator %d drew %s in two jobs", i, fa[i])
		}
	}
}

// A job's CPU limit bounds all its processes together, and the box serves
// the next job.
func TestBoxCPULimitOverAllProcesses(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	spec := py(`
import os
for _ in range(3):
    if os.fork() == 0:
        while True: pass
while True: pass
`)
	spec.Limits = job.Limits{CPUMS: 1000, TimeoutMS: 30_000}
	res := runAs(t, rt, "acme", spec)
	if res.Status != job.StatusTimedOut || res.Error == nil || !strings.Contains(res.Error.Message, "CPU") {
		t.Fatalf("got %s %+v; want timed_out at the CPU limit", res.Status, res.Error)
	}
	if res.CPUMS > 1600 {
		t.Errorf("4 processes used %d ms of CPU under a 1000 ms limit", res.CPUMS)
	}
	requireSucceeded(t, runAs(t, rt, "acme", py("print(1)")), "1\n")
}

// A box job whose worker is gone (its control connection closed) or stopped
// (no heartbeat) is ended within about a second: its code never finishes.
func TestBoxJobEndsWithItsLease(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"closed", "stopped"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			rt := setupBoxes(t, BoxConfig{})
			spec := py("import time\nprint('started', flush=True)\ntime.sleep(3)\nopen('/work/finished', 'w').write('x')")
			spec.Limits.TimeoutMS = 20_000
			done := make(chan job.Result, 1)
			started := make(chan struct{})
			var once sync.Once
			base := Request{Tenant: "acme", Output: func(_ string, b []byte) {
				if strings.Contains(string(b), "started") {
					once.Do(func() { close(started) })
				}
			}}
			ctx := t.Context()
			go func() {
				res, err := rt.Run(ctx, asRun(base, job.NewID(), spec))
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				done <- res
			}()
			var sb *sandbox
			testkit.Eventually(t, 30*time.Second, "a box job running", func() bool {
				rt.box.running.Range(func(_, v any) bool { sb = v.(*sandbox); return false })
				return sb != nil
			})
			testkit.Closed(t, started, 30*time.Second, "the job's code to run")
			dirs, _ := filepath.Glob(filepath.Join(rt.cfg.StateDir, rt.cfg.WorkerID, sb.id, "work", "j*"))
			if len(dirs) != 1 {
				t.Fatalf("the running job's work dir: %v", dirs)
			}
			dir := dirs[0]
			start := time.Now()
			switch how {
			case "closed":
				_ = sb.box.ctl.CloseWrite() // the zygote reads the end a dead worker's socket shows
			case "stopped":
				sb.box.beatsPaused.Store(true) // a stopped worker sends no heartbeat
			}
			testkit.Poll(5*time.Second, func() bool { return inCgroupOf(t, sb.id) <= 2 })
			if n := inCgroupOf(t, sb.id); n > 2 || time.Since(start) > 2500*time.Millisecond {
				t.Errorf("the job ran on %s after its lease ended (%d processes in the box)", time.Since(start), n)
			}
			// Every process of the job is gone: its file can never appear.
			if _, err := os.Stat(filepath.Join(dir, "finished")); err == nil {
				t.Error("the job's code finished after its lease ended")
			}
			res := <-done
			if res.Status == job.StatusSucceeded {
				t.Errorf("the job succeeded after its lease ended: %+v", res)
			}
			if how == "stopped" && (res.Status != job.StatusInternalError || res.Error == nil || !res.Error.Retryable) {
				t.Errorf("got %s %+v; want a retryable internal error (the run belongs to a redelivery now)", res.Status, res.Error)
			}
		})
	}
}

// userNamespaceProbe is what a job sees of its user namespace and tries
// against the uids it is given (argv: the uids of other jobs): a JSON line;
// then, with "wait", it holds until the host writes /work/go.
const userNamespaceProbe = `
import ctypes, errno, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def cerr(r):
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
wait = sys.argv[1] == "wait"
others = [int(a) for a in sys.argv[2:]]
out = {"uid": os.getuid(), "gid": os.getgid(), "box": os.stat("/work").st_dev}
out["uid_map"] = open("/proc/self/uid_map").read().split()
out["gid_map"] = open("/proc/self/gid_map").read().split()
out["setgroups"] = open("/proc/self/setgroups").read().strip()
out["root_owner"] = [os.stat("/").st_uid, os.stat("/usr/bin/python3").st_gid]
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
out["caps"] = [st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
out["setuid_root"] = err(lambda: os.setuid(0))
out["setuid_others"] = [err(lambda u=u: os.setresuid(u, u, u)) for u in others]
open("/work/f", "w").close()
out["chown_root"] = err(lambda: os.chown("/work/f", 0, 0))
out["chown_others"] = [err(lambda u=u: os.chown("/work/f", u, -1)) for u in others]
out["write_uid_map"] = err(lambda: open("/proc/self/uid_map", "w").write("0 0 1\n"))
out["unshare_user"] = cerr(libc.unshare(0x10000000))
ns = os.open("/proc/self/ns/user", os.O_RDONLY)
out["ns_parent"] = cerr(libc.ioctl(ns, 0xb702))  # NS_GET_PARENT
out["setns_own"] = cerr(libc.setns(ns, 0x10000000))
print(json.dumps(out), flush=True)
while wait and not os.path.exists("/work/go"):
    time.sleep(0.05)
`

// userNamespaceSeen is userNamespaceProbe's line.
type userNamespaceSeen struct {
	UID          int      `json:"uid"`
	GID          int      `json:"gid"`
	Box          uint64   `json:"box"` // the device of /work: the box's work dir tmpfs
	UIDMap       []string `json:"uid_map"`
	GIDMap       []string `json:"gid_map"`
	SetGroups    string   `json:"setgroups"`
	RootOwner    []int    `json:"root_owner"`
	Caps         []string `json:"caps"`
	SetUIDRoot   string   `json:"setuid_root"`
	SetUIDOthers []string `json:"setuid_others"`
	ChownRoot    string   `json:"chown_root"`
	ChownOthers  []string `json:"chown_others"`
	WriteUIDMap  string   `json:"write_uid_map"`
	UnshareUser  string   `json:"unshare_user"`
	NSParent     string   `json:"ns_parent"`
	SetnsOwn     string   `json:"setns_own"`
}

// check fails the test for whatever the job saw of another uid or held of
// a capability.
func (s userNamespaceSeen) check(t *testing.T, job string) {
	t.Helper()
	own := []string{strconv.Itoa(s.UID), strconv.Itoa(s.UID), "1"}
	if s.GID != s.UID || !slices.Equal(s.UIDMap, own) || !slices.Equal(s.GIDMap, own) || s.SetGroups != "deny" {
		t.Errorf("%s: uid %d gid %d, uid_map %v, gid_map %v, setgroups %s; want its own id mapped alone, setgroups denied", job, s.UID, s.GID, s.UIDMap, s.GIDMap, s.SetGroups)
	}
	if !slices.Equal(s.RootOwner, []int{65534, 65534}) {
		t.Errorf("%s: the image's files belong to %v; want the overflow ids (the box's root is not mapped)", job, s.RootOwner)
	}
	for _, c := range s.Caps {
		if c != "0000000000000000" {
			t.Errorf("%s: capability sets %v; want every one empty", job, s.Caps)
			break
		}
	}
	for what, got := range map[string]string{"setuid(0)": s.SetUIDRoot, "chown to root": s.ChownRoot} {
		if got != "EINVAL" {
			t.Errorf("%s: %s: %s; want EINVAL (root is not mapped)", job, what, got)
		}
	}
	for i, got := range append(slices.Clone(s.SetUIDOthers), s.ChownOthers...) {
		if got != "EINVAL" {
			t.Errorf("%s: taking or giving another job's uid (%d): %s; want EINVAL (not mapped)", job, i, got)
		}
	}
	if s.WriteUIDMap == "ok" || s.UnshareUser != "EPERM" || s.NSParent != "EPERM" || s.SetnsOwn != "EPERM" {
		t.Errorf("%s: rewriting its uid map %s, a user namespace %s, its namespace's parent %s, setns %s; want all refused (the parent: out of its scope)",
			job, s.WriteUIDMap, s.UnshareUser, s.NSParent, s.SetnsOwn)
	}
}

// Every job of a box runs in a user namespace of its own, nested in the
// box's, that maps its own uid and gid alone: it names no other uid (not
// the box's root, not the job before it), holds no capability, and cannot
// make or leave a namespace. Seen from the host, its namespace's parent is
// the box's and its one mapping is its own uid. Two jobs in a row get other
// uids and other namespaces. This is what lets a box serve jobs of different
// tenants one after the other: what one job could do with the other's uid
// it cannot name.
func TestBoxJobsHaveUserNamespacesOfTheirOwn(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	first := py(userNamespaceProbe)
	first.Args = []string{"wait"}
	first.Limits.TimeoutMS = 60_000
	lines := make(chan string, 1)
	base := Request{Tenant: "acme", Output: func(stream string, p []byte) {
		if stream == "stdout" && strings.Contains(string(p), `"uid"`) {
			select {
			case lines <- string(p):
			default:
			}
		}
	}}
	done := make(chan job.Result, 1)
	go func() {
		res, err := rt.Run(t.Context(), asRun(base, job.NewID(), first))
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- res
	}()
	var line string
	select {
	case line = <-lines:
	case res := <-done:
		t.Fatalf("job 1 ended before reporting: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	case <-time.After(time.Minute):
		t.Fatal("the first job did not report")
	}
	var a userNamespaceSeen
	if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &a); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	a.check(t, "job 1")
	var sb *sandbox
	rt.box.running.Range(func(_, v any) bool { sb = v.(*sandbox); return false })
	if sb == nil {
		t.Fatal("no box job running")
	}
	hostSeesNestedNamespace(t, rt, sb, a.UID)
	dirs, _ := filepath.Glob(filepath.Join(rt.cfg.StateDir, rt.cfg.WorkerID, sb.id, "work", "j*"))
	if len(dirs) != 1 {
		t.Fatalf("the running job's work dir: %v", dirs)
	}
	if err := os.WriteFile(filepath.Join(dirs[0], "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Status != job.StatusSucceeded {
		t.Fatalf("job 1: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	second := py(userNamespaceProbe)
	second.Args = []string{"no", strconv.Itoa(a.UID)}
	res := runAs(t, rt, "acme", second)
	var b userNamespaceSeen
	if res.Status != job.StatusSucceeded {
		t.Fatalf("job 2: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &b); err != nil {
		t.Fatalf("%q: %v", res.Stdout, err)
	}
	b.check(t, "job 2")
	if b.Box != a.Box {
		t.Errorf("job 2 ran in box %d, job 1 in %d: not the same box", b.Box, a.Box)
	}
	if b.UID == a.UID {
		t.Errorf("two jobs in a row ran as uid %d", a.UID)
	}
}

// hostSeesNestedNamespace checks, from the host, box sb's running job of
// uid (in the box): its process is in a user namespace that is neither the
// host's nor the box's, whose parent is the box's, and whose one mapping is
// the job's uid to the box's host uid for it.
func hostSeesNestedNamespace(t *testing.T, rt *Containerd, sb *sandbox, uid int) {
	t.Helper()
	nsOf := func(pid int) uint64 {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &st); err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		return st.Ino
	}
	host := nsOf(os.Getpid())
	var box uint64
	for _, pid := range sb.box.supervisors {
		if ns := nsOf(pid); ns != host {
			box = ns
		}
	}
	if box == 0 {
		t.Fatalf("no supervisor of box %s is in a user namespace of the box's", sb.id)
	}
	pids, err := boxProcs(sb)
	if err != nil {
		t.Fatal(err)
	}
	jobHost := strconv.Itoa(sb.box.base + uid)
	var found bool
	for _, pid := range pids {
		if slices.Contains(sb.box.supervisors, pid) {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil || !strings.Contains(string(status), "\nUid:\t"+jobHost+"\t") {
			continue // the job's pid namespace's reaper: the box's root, in the box's namespace
		}
		found = true
		ns := nsOf(pid)
		if ns == host || ns == box {
			t.Errorf("the job's process %d is in the %s's user namespace", pid, map[bool]string{true: "host", false: "box"}[ns == host])
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
		if err != nil {
			t.Fatal(err)
		}
		parent, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_PARENT)
		f.Close()
		if err != nil {
			t.Fatalf("NS_GET_PARENT: %v", err)
		}
		var st unix.Stat_t
		err = unix.Fstat(parent, &st)
		unix.Close(parent)
		if err != nil || st.Ino != box {
			t.Errorf("the job's user namespace's parent is %d (%v); want the box's, %d", st.Ino, err, box)
		}
		m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
		if want := []string{strconv.Itoa(uid), jobHost, "1"}; err != nil || !slices.Equal(strings.Fields(string(m)), want) {
			t.Errorf("the job's uid_map from the host: %q (%v); want %v", m, err, want)
		}
	}
	if !found {
		t.Errorf("no process of uid %s in box %s (pids %v)", jobHost, sb.id, pids)
	}
}
