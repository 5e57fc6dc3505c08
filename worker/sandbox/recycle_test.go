package sandbox

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// testRecycled reports whether this run of the suite puts every python job
// of setup's runtime on a recycled sandbox (KILN_SANDBOX_PATH=recycled): the
// profile probes and hostile programs then run on the recycled path, as
// one tenant's jobs one after another.
func testRecycled() bool { return os.Getenv("KILN_SANDBOX_PATH") == "recycled" }

// recycledConfig turns cfg into a recycling runtime's: its own worker id,
// python recycled for every tenant, and no preloading (so a job with a small
// memory limit fits).
func recycledConfig(cfg Config) Config {
	cfg.WorkerID = testWorkerID + "-recycle-" + randomHex(3)
	cfg.Recycle = RecycleConfig{Runtimes: []string{"python"}}
	cfg.Pool.Preload = map[string][]string{"python": nil}
	return cfg
}

// awaitRecycledFor makes sure a recycled container of spec's class waits
// for the suite's tenant and returns the hit count before the job.
func awaitRecycledFor(t testing.TB, r *Containerd, spec job.Spec) int64 {
	t.Helper()
	ctx := namespacesCtx(t, r)
	cls, img, ok := specClass(t, r, spec)
	if !ok {
		return r.RecycleStats().Hits
	}
	key := recycleKey{tenant: "suite", class: cls}
	deadline := time.Now().Add(time.Minute)
	for {
		r.recycler.mu.Lock()
		idle, creating := len(r.recycler.idle[key]), r.recycler.creating[key]
		hits := r.recycler.hits
		r.recycler.mu.Unlock()
		if idle > 0 {
			return hits
		}
		if !creating {
			r.grow(ctx, key, img)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recycled sandbox of %+v within a minute: %+v", key, r.RecycleStats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setupRecycled is a runtime recycling python's jobs for every tenant.
func setupRecycled(t *testing.T, rc RecycleConfig) *Containerd {
	t.Helper()
	if underGVisor() {
		t.Skip("gVisor sandboxes are not recycled")
	}
	cfg := setupConfig(t)
	cfg.WorkerID = testWorkerID + "-recycle-" + randomHex(3)
	rc.Runtimes = []string{"python"}
	cfg.Recycle = rc
	return startRuntime(t, cfg)
}

// runAs runs spec as tenant's job.
func runAs(t *testing.T, rt *Containerd, tenant string, spec job.Spec) job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(WithHooks(t.Context(), Hooks{Tenant: tenant}), 2*time.Minute)
	defer cancel()
	res, err := rt.Run(ctx, job.NewID(), spec)
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	return res
}

// awaitRecycled waits until a recycled container is idle.
func awaitRecycled(t *testing.T, rt *Containerd, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for rt.RecycleStats().Idle < n {
		if time.Now().After(deadline) {
			t.Fatalf("no idle recycled sandbox within a minute: %+v", rt.RecycleStats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// containerOf names the container a job ran in: the hostname is the same in
// every sandbox and the cgroup namespace hides the cgroup's name, but the
// status file kiln-init reports in is a host file of the container's own.
const containerOf = "import os; print(os.stat('/run/kiln/status').st_ino)"

// Job 1 leaves everything a job can leave behind; job 2 of the same tenant,
// in the same container, finds none of it.
func TestRecycledWipesBetweenJobs(t *testing.T) {
	t.Parallel()
	rt := setupRecycled(t, RecycleConfig{})
	first := runAs(t, rt, "acme", py(containerOf)) // a miss: runs cold, a recycled container starts
	requireSucceeded(t, first, first.Stdout)
	awaitRecycled(t, rt, 1)

	dirty := py(`
import os, sys, subprocess, ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
open('/tmp/left', 'w').write('x')
os.makedirs('/tmp/locked/deep')
open('/tmp/locked/deep/f', 'w').write('x')
os.chmod('/tmp/locked/deep', 0)
os.chmod('/tmp/locked', 0)
open('/work/left', 'w').write('x')
open('/dev/shm/left', 'w').write('x')
# A background process that tries to outlive the job.
subprocess.Popen(['sleep', '300'], start_new_session=True)
pid = os.fork()
if pid == 0:
    os.setsid()
    import time; time.sleep(300)
# System V shared memory, a semaphore set and a message queue.
assert libc.shmget(0x4b494c4e, 4096, 0o1000 | 0o600) >= 0
assert libc.semget(0x4b494c4f, 1, 0o1000 | 0o600) >= 0
assert libc.msgget(0x4b494c50, 0o1000 | 0o600) >= 0
# A POSIX message queue.
libc.mq_open.restype = ctypes.c_int
assert libc.mq_open(b'/kiln-left', 0o100 | 0o2, 0o600, None) >= 0, ctypes.get_errno()
# The environment and a module.
os.environ['LEFT'] = '1'
json.dumps = lambda *a, **k: 'patched'
print(os.stat('/run/kiln/status').st_ino)
`)
	res := runAs(t, rt, "acme", dirty)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("the dirty job: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	dirtyIn := strings.TrimSpace(res.Stdout)
	if dirtyIn == strings.TrimSpace(first.Stdout) {
		t.Fatalf("the dirty job ran in the first job's container (%s), which was a cold one", dirtyIn)
	}

	check := py(`
import os, json, subprocess, ctypes
seen = []
for p in ('/tmp/left', '/tmp/locked', '/work/left', '/dev/shm/left', '/dev/mqueue/kiln-left'):
    if os.path.lexists(p): seen.append(p)
for kind in ('shm', 'sem', 'msg'):
    rows = open('/proc/sysvipc/' + kind).read().splitlines()[1:]
    if rows: seen.append('sysv ' + kind)
procs = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]
if procs: seen.append('processes %s' % [open('/proc/%s/cmdline' % p).read() for p in procs])
if 'LEFT' in os.environ: seen.append('env')
if json.dumps({}) == 'patched': seen.append('module')
print(os.stat('/run/kiln/status').st_ino)
print(seen)
`)
	res = runAs(t, rt, "acme", check)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.Status != job.StatusSucceeded || len(lines) != 2 {
		t.Fatalf("the check job: %s %+v\n%s\n%s", res.Status, res.Error, res.Stdout, res.Stderr)
	}
	if lines[0] != dirtyIn {
		t.Fatalf("the check job ran in %s, the dirty one in %s: not the same container", lines[0], dirtyIn)
	}
	if lines[1] != "[]" {
		t.Errorf("job 2 found what job 1 left: %s", lines[1])
	}

	// Another tenant never lands in that container.
	other := runAs(t, rt, "globex", py(containerOf))
	requireSucceeded(t, other, other.Stdout)
	if strings.TrimSpace(other.Stdout) == dirtyIn {
		t.Fatalf("tenant globex ran in tenant acme's recycled container %s", dirtyIn)
	}
	if st := rt.RecycleStats(); st.Hits < 2 {
		t.Errorf("recycled stats %+v; want the dirty and the check job as hits", st)
	}
}

// Limits, output and endings on the recycled path are the job's own, and
// an anomaly (a timeout, an OOM kill, a job that kills its supervisor)
// retires the container; the next job still runs.
func TestRecycledLimitsAndEndings(t *testing.T) {
	t.Parallel()
	rt := setupRecycled(t, RecycleConfig{})
	runAs(t, rt, "acme", py("print(1)"))
	cases := []struct {
		name  string
		spec  job.Spec
		check func(job.Result) string
	}{
		{"exit code", py("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"), func(r job.Result) string {
			if r.Status != job.StatusFailed || r.Code() != 3 || r.Stdout != "out\n" || !strings.Contains(r.Stderr, "err") {
				return "want failed, exit 3, its own output"
			}
			return ""
		}},
		{"self SIGKILL", py("import os; os.kill(os.getpid(), 9)"), func(r job.Result) string {
			if r.Status != job.StatusFailed || r.Signal != "SIGKILL" {
				return "want failed by SIGKILL"
			}
			return ""
		}},
		{"stdin", job.Spec{Runtime: "python", Code: "import sys; print(sys.stdin.read().upper())", Stdin: "hello"}, func(r job.Result) string {
			if r.Stdout != "HELLO\n" {
				return "want its stdin"
			}
			return ""
		}},
		{"output cap", job.Spec{Runtime: "python", Code: "print('x' * 5000)", Limits: job.Limits{OutputBytes: 100}}, func(r job.Result) string {
			if !r.StdoutTruncated || len(r.Stdout) != 100 || r.StdoutBytes != 5001 {
				return "want 100 of 5001 bytes kept"
			}
			return ""
		}},
		{"CPU limit", job.Spec{Runtime: "python", Code: "while True: pass", Limits: job.Limits{CPUMS: 1000, TimeoutMS: 20000}}, func(r job.Result) string {
			if r.Status != job.StatusTimedOut || r.WallMS > 5000 {
				return "want timed_out at the CPU limit"
			}
			return ""
		}},
		{"memory", job.Spec{Runtime: "python", Code: "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1", Limits: job.Limits{MemoryMB: 256}}, func(r job.Result) string {
			if r.Status != job.StatusOOMKilled {
				return "want oom_killed"
			}
			return ""
		}},
		{"wall clock", job.Spec{Runtime: "python", Code: "import time; time.sleep(60)", Limits: job.Limits{TimeoutMS: 1000}}, func(r job.Result) string {
			if r.Status != job.StatusTimedOut {
				return "want timed_out"
			}
			return ""
		}},
		{"kills its supervisor", py("import os; os.kill(os.getppid(), 9); import time; time.sleep(1)"), func(r job.Result) string {
			if r.Status != job.StatusFailed || r.Error == nil || r.Error.Retryable {
				return "want failed, not retryable"
			}
			return ""
		}},
	}
	for _, c := range cases {
		awaitRecycled(t, rt, 1)
		before := rt.RecycleStats().Hits
		res := runAs(t, rt, "acme", c.spec)
		if rt.RecycleStats().Hits != before+1 {
			t.Errorf("%s: did not run recycled", c.name)
		}
		if msg := c.check(res); msg != "" {
			t.Errorf("%s: %s; got %s %+v exit %d signal %q stdout %q stderr %q", c.name, msg, res.Status, res.Error, res.Code(), res.Signal, res.Stdout, res.Stderr)
		}
	}
	awaitRecycled(t, rt, 1)
	requireSucceeded(t, runAs(t, rt, "acme", py("print(6*7)")), "42\n")
	// The OOM kill, the wall-clock timeout and the supervisor's death each
	// retire their container (a CPU limit reached is the job's own ending).
	if st := rt.RecycleStats(); st.Retired < 3 {
		t.Errorf("stats %+v: want the OOM, the timeout and the supervisor kill to retire their containers", st)
	}
}

// A recycled container is retired after MaxJobs jobs.
func TestRecycledMaxJobs(t *testing.T) {
	t.Parallel()
	rt := setupRecycled(t, RecycleConfig{MaxJobs: 3})
	runAs(t, rt, "acme", py("print(1)"))
	seen := map[string]int{}
	for range 6 {
		awaitRecycled(t, rt, 1)
		res := runAs(t, rt, "acme", py(containerOf))
		seen[strings.TrimSpace(res.Stdout)]++
	}
	for c, n := range seen {
		if n > 3 {
			t.Errorf("container %s served %d jobs; want at most 3", c, n)
		}
	}
	if len(seen) < 2 {
		t.Errorf("6 jobs in %d container(s); want a new one after 3", len(seen))
	}
}

// A recycled job's output dir comes back as its artifacts, and the next
// job in the same container starts with an empty one.
func TestRecycledArtifacts(t *testing.T) {
	t.Parallel()
	rt := setupRecycled(t, RecycleConfig{})
	st := &memStore{objs: map[string][]byte{}}
	ctx := WithHooks(t.Context(), Hooks{Tenant: "acme", Store: st.put})
	run := func(code string) job.Result {
		t.Helper()
		res, err := rt.Run(ctx, job.NewID(), py(code))
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("%v: %s %+v\n%s", err, res.Status, res.Error, res.Stderr)
		}
		return res
	}
	run("print(1)")
	awaitRecycled(t, rt, 1)
	first := run(`import os; open(os.environ["KILN_OUTPUT_DIR"] + "/first.txt", "w").write("one")` + "\n" + containerOf)
	awaitRecycled(t, rt, 1)
	second := run(`import os; print(sorted(os.listdir(os.environ["KILN_OUTPUT_DIR"])))
open(os.environ["KILN_OUTPUT_DIR"] + "/second.txt", "w").write("two")` + "\n" + containerOf)
	if first.Stdout == "" || !strings.HasSuffix(second.Stdout, first.Stdout) {
		t.Fatalf("the jobs ran in different containers: %q, %q", first.Stdout, second.Stdout)
	}
	if !strings.HasPrefix(second.Stdout, "[]\n") {
		t.Errorf("job 2's output dir at its start: %q; want empty", second.Stdout)
	}
	if len(first.Artifacts) != 1 || first.Artifacts[0].Name != "first.txt" || string(st.objs[first.Artifacts[0].SHA256]) != "one" {
		t.Errorf("job 1's artifacts: %+v", first.Artifacts)
	}
	if len(second.Artifacts) != 1 || second.Artifacts[0].Name != "second.txt" {
		t.Errorf("job 2's artifacts: %+v; want second.txt alone", second.Artifacts)
	}
}
