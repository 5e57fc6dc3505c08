package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Hostile programs: each must end with a well-defined result within its
// limits, and the runtime must run a normal job right after.

func TestHostileInfiniteLoop(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py("while True: pass")
	spec.Limits.TimeoutMS = 1000
	start := time.Now()
	res := run(t, rt, spec)
	elapsed := time.Since(start)
	if res.Status != job.StatusTimedOut || res.Error == nil || res.Error.Category != job.CategoryTimeout || res.Signal != "SIGKILL" {
		t.Fatalf("got %s %+v signal %q; want timed_out/timeout by SIGKILL", res.Status, res.Error, res.Signal)
	}
	if res.WallMS < 1000 || res.WallMS > 2000 {
		t.Errorf("wall_ms %d; want between the 1 s timeout and 2 s", res.WallMS)
	}
	t.Logf("Run took %s in all (wall_ms %d, cpu_ms %d)", elapsed, res.WallMS, res.CPUMS)
	healthy(t, rt)
}

func TestHostileMemory(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(`"A" * 10**10`)
	spec.Limits.MemoryMB = 64
	res := run(t, rt, spec)
	if res.Status != job.StatusOOMKilled || res.Error == nil || res.Error.Category != job.CategoryMemoryLimit {
		t.Fatalf("got %s %+v (exit %d, signal %q, peak %d)\n%s", res.Status, res.Error, res.Code(), res.Signal, res.MemoryPeakBytes, res.Stderr)
	}
	t.Logf("signal %q exit %v peak %d bytes", res.Signal, res.ExitCode, res.MemoryPeakBytes)
	if res.MemoryPeakBytes < 60<<20 {
		t.Errorf("memory_peak_bytes %d; want about the 64 MB limit", res.MemoryPeakBytes)
	}
	healthy(t, rt)
}

// processesOf counts host processes running as any of rt's sandbox uids.
func processesOf(t *testing.T, rt *Containerd) (n int, cmdlines []string) {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, l := range strings.Split(string(st), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || f[0] != "Uid:" {
				continue
			}
			if uid, _ := strconv.Atoi(f[1]); uid >= rt.cfg.UIDStart && uid < rt.cfg.UIDStart+rt.cfg.UIDCount {
				n++
				cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				cmdlines = append(cmdlines, string(bytes.ReplaceAll(cl, []byte{0}, []byte{' '})))
			}
		}
	}
	return n, cmdlines
}

// inCgroupOf counts host processes whose cgroup path names the job (a
// container id starts with its job id).
func inCgroupOf(t *testing.T, jobID string) int {
	t.Helper()
	return len(pidsInCgroupOf(t, jobID))
}

// pidsInCgroupOf lists the host pids inCgroupOf counts.
func pidsInCgroupOf(t *testing.T, jobID string) []int {
	t.Helper()
	if jobID == "" {
		t.Fatal("inCgroupOf: no cgroup name")
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup")); err == nil && strings.Contains(string(cg), jobID) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// supervisorsOf is how many processes of a sandbox's cgroup are not its
// job's: a box's kiln-init, the launcher waiting for the zygote, and the
// zygote (key names a box), else none.
func supervisorsOf(key string) int {
	if strings.HasPrefix(key, poolIDPrefix) {
		return 3
	}
	return 0
}

// TestHostileForkBomb is not parallel: it also compares the host's count of
// sandbox-user processes before and after, which this package's other
// sandbox tests running at the same time would disturb.
func TestHostileForkBomb(t *testing.T) {
	rt := setup(t)
	before, _ := processesOf(t, rt)
	spec := py(`
import os
me = os.getpid()
n = 0
reported = False
while True:
    try:
        os.fork()
        if os.getpid() == me:
            n += 1
    except OSError:
        if os.getpid() == me and not reported:
            print("fork refused after", n, flush=True)
            reported = True
`)
	// Long enough for the bomb to reach the limit on a slow host (the
	// emulated cgroup v2 guest under load took more than two seconds).
	spec.Limits = job.Limits{Pids: 32, TimeoutMS: 5000}
	id := job.NewID()
	res, err := rt.Run(t.Context(), Request{ID: id, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case res.Status == job.StatusTimedOut:
	case underGVisor() && res.Status == job.StatusFailed && res.Error != nil && !res.Error.Retryable &&
		strings.Contains(res.Error.Message, "limit of processes"):
		// gVisor's kernel runs in the job's cgroup and dies when the bomb
		// leaves it no thread to start (docs/security.md, "gVisor"): the job's
		// failure, judged from the cgroup's pids counter, never retried.
		t.Logf("gVisor: %s %+v", res.Status, res.Error)
	default:
		t.Fatalf("got %s %+v; want timed_out\n%s", res.Status, res.Error, res.Stderr)
	}
	var forks int
	if _, err := fmt.Sscanf(res.Stdout, "fork refused after %d", &forks); (err != nil || forks >= 32) && res.Status == job.StatusTimedOut {
		t.Errorf("stdout %q: want the pids limit of 32 to refuse a fork", res.Stdout)
	}
	// The result comes before the sandbox is removed.
	if err := rt.Settle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := inCgroupOf(t, id); n != 0 {
		t.Errorf("%d processes of the fork bomb still on the host", n)
	}
	// Another package's sandbox tests may run meanwhile, so the host-wide
	// count is only a hint unless nothing else runs.
	if after, left := processesOf(t, rt); after > before {
		t.Logf("note: %d processes of sandbox uids before, %d after: %q", before, after, left)
	}
	healthy(t, rt)
}

func TestHostileOutputFlood(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	spec := py(`
import sys
b = b"x" * (1 << 20)
for _ in range(200):
    sys.stdout.buffer.write(b)
sys.stderr.write("done\n")
`)
	spec.Limits.TimeoutMS = 60_000
	res := run(t, rt, spec)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	if !res.StdoutTruncated || res.StdoutBytes != 200<<20 || int64(len(res.Stdout)) != res.Limits.OutputBytes {
		t.Fatalf("stdout kept %d bytes of %d, truncated %v; want the %d-byte cap of 200 MiB", len(res.Stdout), res.StdoutBytes, res.StdoutTruncated, res.Limits.OutputBytes)
	}
	if res.Stderr != "done\n" || res.StderrTruncated {
		t.Errorf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
	// The output was drained, not buffered: the process did not allocate
	// anything near 200 MiB (TotalAlloc counts every allocation, freed or
	// not, of every test running in parallel, hence the margin; keeping the
	// output would have cost 200 MiB and more for the growing copies).
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 128<<20 {
		t.Errorf("test process allocated %d MiB while 200 MiB of output went by", grew>>20)
	}
	if after.HeapSys > 256<<20 {
		t.Errorf("heap reserved %d MiB", after.HeapSys>>20)
	}
	t.Logf("allocated %d KiB in total while draining 200 MiB; wall %d ms", (after.TotalAlloc-before.TotalAlloc)>>10, res.WallMS)
	healthy(t, rt)
}

func TestHostileFillTmp(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(`
import os
for d in ("/tmp", "/work"):
    n = 0
    try:
        with open(d + "/fill", "wb") as f:
            while True:
                f.write(b"z" * 65536); f.flush(); n += 65536
    except OSError as e:
        print(d, n, e.errno)
`)
	spec.Limits.DiskMB = 4
	res := run(t, rt, spec)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("got %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		var dir string
		var n, errno int
		if _, err := fmt.Sscan(line, &dir, &n, &errno); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if n > 4<<20 || n < 3<<20 {
			t.Errorf("%s took %d bytes; want it stopped at the 4 MiB cap", dir, n)
		}
	}
	if strings.Count(res.Stdout, "\n") != 2 {
		t.Fatalf("stdout %q: want one line per directory", res.Stdout)
	}
	healthy(t, rt)
}

// The file kiln-init reports in is the supervisor uid's on the
// container-per-job paths, which the job cannot open; it lives on a tmpfs
// it shares with the output channel file alone (initFSBytes, charged to
// the job's cgroup) all the same, so nothing written there reaches the
// host's disk (a job once wrote 400 MiB into it, outside disk_mb, when
// kiln-init shared its uid). In a box the file is not in the job's view.
func TestHostileFillStatusFile(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(fmt.Sprintf(`
import os
n, err = 0, 0
try:
    with open(%q, "r+b") as f:
        try:
            for _ in range(256):
                f.write(b"z" * 262144); f.flush(); n += 262144
        finally:
            f.seek(0); f.truncate(0)
except OSError as e:
    err = e.errno
print(n, err)
`, initStatusPath))
	spec.Limits.DiskMB = 64
	spec.Limits.MemoryMB = 512
	res := run(t, rt, spec)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("got %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	var n, errno int
	if _, err := fmt.Sscan(res.Stdout, &n, &errno); err != nil {
		t.Fatalf("stdout %q: %v", res.Stdout, err)
	}
	t.Logf("the job wrote %d bytes into the status file (errno %d)", n, errno)
	if n > initFSBytes || errno == 0 {
		t.Fatalf("the job wrote %d bytes into the status file (errno %d); want at most %d, then a refusal", n, errno, initFSBytes)
	}
	healthy(t, rt)
}

// A grandchild that detaches (double fork + setsid) must not outlive the job
// nor keep it running.
func TestHostileDoubleFork(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	marker := "kiln-orphan-" + job.NewID()
	spec := py(fmt.Sprintf(`
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(600)", %q])
    os._exit(0)
os.wait()
print("parent done")
`, marker))
	spec.Limits.TimeoutMS = 30_000
	res := run(t, rt, spec)
	requireSucceeded(t, res, "parent done\n")
	if res.WallMS > 10_000 {
		t.Errorf("wall_ms %d: the orphan kept the job alive", res.WallMS)
	}
	_, cmdlines := processesOf(t, rt)
	for _, c := range cmdlines {
		if strings.Contains(c, marker) {
			t.Errorf("orphan still running on the host after the job: %q", c)
		}
	}
	healthy(t, rt)
}

// pidfdOfInit is what a job gets trying to open pid 1's /proc dir for a
// pidfd and signal through it: a box job sees no /proc/1 (the reaper is not
// its process); in a container the profile refuses pidfd_send_signal.
func pidfdOfInit() string {
	if testBox() {
		return "ENOENT\n"
	}
	return "ENOSYS\n"
}

// Signalling pid 1 (kiln-init) from inside: the kernel protects a pid
// namespace's init from its own namespace, and the profile refuses the
// rest, so the job goes on. Under gVisor pid 1 is the job's own launcher
// (gvisorOwnInit).
func TestHostileKillInit(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	for _, code := range []string{
		"import os\nos.kill(1, 9)\nprint('alive')",
		"import subprocess\nsubprocess.run(['python3', '-c', 'import os; os.kill(os.getppid(), 9)'])\nprint('alive')",
		"import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')",
	} {
		res := run(t, rt, py(code))
		if res.Status != job.StatusSucceeded && res.Status != job.StatusFailed {
			t.Fatalf("%q: got %s %+v", code, res.Status, res.Error)
		}
		t.Logf("%q → %s %q signal %q", code, res.Status, res.Stdout, res.Signal)
		healthy(t, rt)
	}
	// Every other way to reach pid 1 by its pid, or through its process
	// group, is refused: each attempt prints what it got, and the job then
	// ends on its own terms (a sleep after the attempt gives a signal or a
	// lowered CPU limit time to land on the init).
	for _, c := range []struct{ name, code, want string }{
		{"kill", `print(libc.syscall(62, 1, 9), ctypes.get_errno())`, "-1 3\n"},
		{"kill, pid in the low half of a 64-bit register", `
r = libc.syscall(62, ctypes.c_long(0x1_0000_0001), 9)
print(r, ctypes.get_errno())`, "-1 3\n"},
		{"tkill", `print(libc.syscall(200, 1, 9), ctypes.get_errno())`, "-1 3\n"},
		{"tgkill", `print(libc.syscall(234, 1, 1, 9), ctypes.get_errno())`, "-1 3\n"},
		{"rt_sigqueueinfo", `
info = (ctypes.c_int * 32)(9, 0, -1)  # si_signo, si_errno, si_code SI_QUEUE
print(libc.syscall(129, 1, 9, info), ctypes.get_errno())`, "-1 3\n"},
		{"rt_tgsigqueueinfo", `
info = (ctypes.c_int * 32)(9, 0, -1)
print(libc.syscall(297, 1, 1, 9, info), ctypes.get_errno())`, "-1 3\n"},
		{"pidfd of /proc/1", `attempt(lambda: signal.pidfd_send_signal(os.open("/proc/1", os.O_RDONLY | os.O_DIRECTORY), 9))`, pidfdOfInit()},
		{"prlimit RLIMIT_FSIZE of pid 1", `attempt(resource.prlimit, 1, resource.RLIMIT_FSIZE, (0, 0))`, "ESRCH\n"},
		{"prlimit RLIMIT_CPU of pid 1", `attempt(resource.prlimit, 1, resource.RLIMIT_CPU, (0, 0))`, "ESRCH\n"},
		{"join pid 1's process group", `attempt(os.setpgid, 0, 1)`, "EPERM\n"},
		{"own limits still settable", `
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.prlimit(0, resource.RLIMIT_CORE, (0, 0))
resource.prlimit(os.getpid(), resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
p = subprocess.Popen(["sleep", "30"])
os.kill(p.pid, 15)
print(p.wait(), os.getpgid(0) == os.getpid())`, "-15 True\n"},
	} {
		res := run(t, rt, py("import ctypes, errno, os, resource, signal, subprocess, time\n"+
			"libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"+
			"def attempt(f, *args):\n    try:\n        f(*args)\n        print('done')\n    except OSError as e:\n        print(errno.errorcode[e.errno])\n"+
			strings.TrimPrefix(c.code, "\n")+"\ntime.sleep(1.5)\n"))
		want := c.want
		if underGVisor() {
			// gVisor answers every errno rule of the profile with EPERM
			// (docs/security.md, "gVisor"); the call is refused all the same.
			want = strings.NewReplacer("-1 3", "-1 1", "ESRCH", "EPERM", "ENOSYS", "EPERM").Replace(want)
			// And pid 1 is the job's own launcher, in a pid namespace of
			// its own (kiln-init's EnvJobPidNS): what is aimed at it lands
			// on the job itself, which ends (or goes on) on its own terms.
			if gv, ok := gvisorOwnInit[c.name]; ok {
				want = gv
			}
			if want == "" {
				if res.Status == job.StatusSucceeded || res.Error == nil || res.Error.Retryable || res.Attempt > 1 {
					t.Errorf("%s: got %s %q %+v; want the job to end by its own hand, once, not retried", c.name, res.Status, res.Stdout, res.Error)
				}
				continue
			}
		}
		if res.Status != job.StatusSucceeded || res.Stdout != want {
			t.Errorf("%s: got %s %q (want succeeded %q) %+v\n%s", c.name, res.Status, res.Stdout, want, res.Error, res.Stderr)
		}
	}
	healthy(t, rt)
}

// gvisorOwnInit is what TestHostileKillInit's attempts on pid 1 get under
// gVisor, where pid 1 is the job's own launcher: "" for the job ending by
// its own hand (a signal it sent itself, a CPU limit it set itself), else
// its output.
var gvisorOwnInit = map[string]string{
	"kill": "", "kill, pid in the low half of a 64-bit register": "", "tkill": "", "tgkill": "",
	"rt_sigqueueinfo": "", "rt_tgsigqueueinfo": "", "prlimit RLIMIT_CPU of pid 1": "",
	"prlimit RLIMIT_FSIZE of pid 1": "done\n", "join pid 1's process group": "done\n",
}

// A symlink planted in the sandbox pointing at host paths: nothing the host
// does with the sandbox (tmpfs teardown, snapshot removal) may follow it.
func TestHostileSymlink(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "victim")
	if err := os.WriteFile(target, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := py(fmt.Sprintf(`
import os
for link, dest in (("/work/evil", %[1]q), ("/work/evildir", %[2]q), ("/tmp/evil", %[1]q), ("/work/etc", "/etc")):
    os.symlink(dest, link)
try:
    open("/work/evil", "w").write("overwritten")
    print("wrote through")
except OSError as e:
    print("write refused:", e.__class__.__name__)
`, target, dir))
	res := run(t, rt, spec)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("got %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	b, err := os.ReadFile(target)
	if err != nil || string(b) != "keep me" {
		t.Fatalf("host file after the job: %q, %v", b, err)
	}
	// Input files are created by the launcher without following links: a
	// file name through a directory the job cannot control still lands in /work.
	spec = py("print(open('sub/f.txt').read(), end='')")
	spec.Files = []job.File{{Name: "sub/f.txt", Content: "inside"}}
	requireSucceeded(t, run(t, rt, spec), "inside")
	healthy(t, rt)
}

// waitForContainer polls until the job's sandbox is running and returns what
// names its cgroup: the job id, or the id of the box running it. It polls
// containerd until the job's container is running a
// task. Polling a real state, not sleeping for a guessed time.
func waitForContainer(t *testing.T, rt *Containerd, jobID string) string {
	t.Helper()
	ctx := namespacesCtx(t, rt)
	var key string
	testkit.Eventually(t, 30*time.Second, "a running container of job "+jobID, func() bool {
		if box := rt.box.boxOfJob(jobID); box != "" {
			key = box
			return true
		}
		cs, err := rt.client.Containers(ctx, fmt.Sprintf(`labels.%q==%q`, ctrd.LabelJobID, jobID))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if task, err := c.Task(ctx, nil); err == nil {
				if st, err := task.Status(ctx); err == nil && st.Status == "running" {
					key = jobID
					return true
				}
			}
		}
		return false
	})
	if key != jobID {
		// A box job's processes are forked right after the box takes it.
		testkit.Poll(30*time.Second, func() bool { return inCgroupOf(t, key) > supervisorsOf(key) })
	}
	return key
}

// A job's CPU limit bounds all its processes together, on every path (box,
// container of its own, pooled): four spinning processes under a 1 s limit
// end at about 1 s of CPU in all, not 1 s each. gVisor's cgroup counts its
// sentry too, so there only RLIMIT_CPU (per process) applies.
func TestHostileCPUOverAllProcesses(t *testing.T) {
	t.Parallel()
	if underGVisor() {
		t.Skip("gVisor: RLIMIT_CPU per process only")
	}
	rt := setup(t)
	spec := py(`
import os
for _ in range(3):
    if os.fork() == 0:
        while True: pass
while True: pass
`)
	spec.Limits = job.Limits{CPUMS: 1000, TimeoutMS: 30_000}
	res := run(t, rt, spec)
	if res.Status != job.StatusTimedOut || res.Error == nil || !strings.Contains(res.Error.Message, "CPU") {
		t.Fatalf("got %s %+v; want timed_out at the CPU limit", res.Status, res.Error)
	}
	if res.CPUMS > 1600 {
		t.Errorf("4 processes used %d ms of CPU under a 1000 ms limit", res.CPUMS)
	}
	healthy(t, rt)
}

// userNamespaceEscape tries every way a job could give itself another uid
// or a capability through user namespaces: make one (unshare, clone), join
// another (its own, pid 1's), rewrite its maps, take root's uid, add a
// group. Each prints its errno name (or "ok"); then the job's capability
// sets, which must still be empty.
const userNamespaceEscape = `
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def e(r):
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def py(f):
    try:
        f(); return "ok"
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
def setns(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as x:
        return errno.errorcode.get(x.errno, "?")
    return e(libc.setns(fd, 0x10000000))
print("unshare", e(libc.unshare(0x10000000)))
print("unshare_all", e(libc.unshare(0x10000000 | 0x00020000 | 0x20000000)))
print("clone", e(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)))
print("setns_self", setns("/proc/self/ns/user"))
print("setns_init", setns("/proc/1/ns/user"))
print("uid_map", py(lambda: open("/proc/self/uid_map", "w").write("0 0 1\n")))
print("setgroups_file", py(lambda: open("/proc/self/setgroups", "w").write("allow")))
print("setuid", py(lambda: os.setuid(0)))
print("setgroups", py(lambda: os.setgroups([0])))
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("caps", " ".join(st.get(k, "absent").strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")))
`

// No job gets another uid or a capability through a user namespace, on any
// path: in a box each job is already in one of its own (the job filter
// refuses another, its maps are written once and /proc is read-only); in a
// container of its own, the profile refuses namespaces to a process
// without capabilities.
func TestHostileUserNamespaces(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res := run(t, rt, py(userNamespaceEscape))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	t.Logf("%v", got)
	for _, k := range []string{"unshare", "unshare_all", "clone", "setns_self", "setns_init", "uid_map", "setgroups_file", "setuid", "setgroups"} {
		if v, ok := got[k]; !ok || v == "ok" {
			t.Errorf("%s: %q; want refused", k, v)
		}
	}
	if want := strings.TrimSpace(strings.Repeat("0000000000000000 ", 5)); got["caps"] != want && !(underGVisor() && strings.Count(got["caps"], "0000000000000000") >= 4) {
		t.Errorf("capability sets after the attempts: %s; want all empty", got["caps"])
	}
	healthy(t, rt)
}
