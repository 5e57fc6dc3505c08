package sandbox

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// testPooled reports whether this run of the suite puts every job of
// setup's runtime on a pooled sandbox (KILN_SANDBOX_PATH=pooled): the
// profile probes and hostile programs then run on the pooled path.
func testPooled() bool { return os.Getenv("KILN_SANDBOX_PATH") == "pooled" }

// pooledConfig turns cfg into a pooled runtime's: its own worker id (the
// pool's sweep removes every container of its worker id that it does not
// own), and no preloading, so a job with a small memory limit can still take
// a pooled sandbox (TestPoolArmsTheJobsLimits covers preloading).
func pooledConfig(cfg Config) Config {
	cfg.WorkerID = testWorkerID + "-pool-" + randomHex(3)
	cfg.Pool = PoolConfig{Max: 2, Min: 1, Preload: map[string][]string{"python": nil, "python-slim": nil, "node": nil}}
	cfg.Boxes.Off = true
	return cfg
}

// specClass is the limits class of a spec's job and its runtime's image; ok
// is false when its limits are refused (the job never gets a sandbox).
func specClass(t testing.TB, r *Containerd, spec job.Spec) (cls poolClass, img *imageEntry, ok bool) {
	t.Helper()
	spec.Normalize()
	lim, err := r.cfg.Policy.Resolve(spec.Limits)
	if err != nil {
		return poolClass{}, nil, false
	}
	img, err = r.images.resolve(namespacesCtx(t, r), spec.Runtime)
	if err != nil {
		t.Fatalf("resolve %s: %v", spec.Runtime, err)
	}
	return classOf(spec.Runtime, img, lim), img, true
}

// awaitPooled makes the pool keep a sandbox of spec's class and waits until
// one is idle; it returns the runtime's hit count before the job.
func awaitPooled(t testing.TB, r *Containerd, spec job.Spec) int64 {
	t.Helper()
	cls, _, ok := specClass(t, r, spec)
	if !ok {
		return poolHits(r, spec.Runtime) // the job is refused before any sandbox
	}
	testkit.Eventually(t, time.Minute, fmt.Sprintf("a pooled %s sandbox of class %+v", spec.Runtime, cls), func() bool {
		r.pool.mu.Lock()
		st := r.pool.classes[cls]
		if st == nil {
			st = &classState{}
			r.pool.classes[cls] = st
		}
		st.target = max(st.target, 1)
		st.lastMiss = time.Now()
		idle := len(st.idle)
		r.pool.mu.Unlock()
		if idle == 0 {
			r.pool.signal()
		}
		return idle > 0
	})
	return poolHits(r, spec.Runtime)
}

func poolHits(r *Containerd, runtime string) int64 {
	for _, s := range r.PoolStats() {
		if s.Runtime == runtime {
			return s.Hits
		}
	}
	return 0
}

// setupPooled is a pooled runtime on the real containerd with the profiles'
// own preloading.
func setupPooled(t *testing.T, pc PoolConfig) *Containerd {
	t.Helper()
	base := setupConfig(t)
	base.WorkerID = testWorkerID + "-pool-" + randomHex(3)
	base.Pool = pc
	return startRuntime(t, base)
}

// A pooled sandbox's job gets its own limits, armed at delivery, and its own
// figures: the CPU time and memory of the launcher's preloading are not the
// job's, and the wall clock starts when the job arrives, not when the
// sandbox was made.
func TestPoolArmsTheJobsLimits(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	t.Parallel()
	rt := setupPooled(t, PoolConfig{Max: 1, Min: 1, Preload: map[string][]string{"python": {"numpy", "pandas"}}})

	hits := awaitPooled(t, rt, py("print(1)"))
	// The idle sandbox has lived longer than the job's whole timeout (most
	// of it importing pandas) before the job comes: the clock must start at
	// delivery.
	spec := py("import sys\nprint('pandas' in sys.modules)")
	spec.Limits.TimeoutMS = 1500
	testkit.Eventually(t, 10*time.Second, "the idle sandbox to outlive the job's timeout", func() bool {
		rt.pool.mu.Lock()
		defer rt.pool.mu.Unlock()
		for _, st := range rt.pool.classes {
			for _, sb := range st.idle {
				if time.Since(sb.prepared) > 2*spec.Limits.Timeout() {
					return true
				}
			}
		}
		return false
	})
	res := run(t, rt, spec)
	requireSucceeded(t, res, "True\n")
	if poolHits(rt, "python") != hits+1 {
		t.Fatalf("the job did not take the pooled sandbox: %+v", rt.PoolStats())
	}
	// Importing pandas costs about half a second of CPU; it happened before
	// the job, so the job's own figure is small.
	if res.CPUMS > 300 {
		t.Errorf("cpu_ms %d; want the job's own (well under the preload's)", res.CPUMS)
	}

	// Memory: 300 MB held against a 200 MB limit armed on a sandbox created
	// with the policy's maximum.
	spec = py("b = bytearray(300 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('kept')")
	spec.Limits.MemoryMB = 200
	res = run(t, rt, spec)
	if res.Status != job.StatusOOMKilled {
		t.Errorf("300 MB under a 200 MB limit: %s %+v; want oom_killed", res.Status, res.Error)
	}
	// pids: the limit is the job's, not the pool's.
	spec = py("import os\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n            import time; time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('refused after', n)\n")
	spec.Limits.Pids = 16
	res = run(t, rt, spec)
	if !strings.HasPrefix(res.Stdout, "refused after") {
		t.Errorf("forking past pids 16: %s %q %s; want refused", res.Status, res.Stdout, res.Stderr)
	}
	// CPU: a 1 s budget on top of the preload's CPU time is a CPU timeout.
	spec = py("while True: pass")
	spec.Limits.CPUMS = 1000
	spec.Limits.TimeoutMS = 20000
	res = run(t, rt, spec)
	// Judged by what ended it, not by the wall time it took: on a loaded
	// host a second of CPU can take several of wall time.
	if res.Status != job.StatusTimedOut || res.Error == nil || !strings.Contains(res.Error.Message, "CPU time") {
		t.Errorf("busy loop with cpu_ms 1000: %s %+v after %d ms; want timed_out by its CPU time limit, not the 20 s wall clock", res.Status, res.Error, res.WallMS)
	}
	// Output cap and the next job still fine.
	spec = py("print('x' * 5000)")
	spec.Limits.OutputBytes = 100
	res = run(t, rt, spec)
	if !res.StdoutTruncated || len(res.Stdout) != 100 || res.StdoutBytes != 5001 {
		t.Errorf("output cap 100: truncated %v, kept %d, total %d", res.StdoutTruncated, len(res.Stdout), res.StdoutBytes)
	}
	healthy(t, rt)
}

// A pooled sandbox's preload is not its job's: a job whose memory limit is
// below what the sandbox holds once it has imported numpy and pandas runs
// on it, its limit counted on top of the preload and its peak without it.
func TestPoolPreloadIsNotTheJobs(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	t.Parallel()
	rt := setupPooled(t, PoolConfig{Max: 1, Min: 1, Preload: map[string][]string{"python": {"numpy", "pandas"}}})
	// No wait after: a sandbox is pooled only once its launcher has
	// imported pandas, so arm sees what it holds (before, on a slow host,
	// arm lowered the limit mid-import and the preload was oom_killed as
	// this job).
	awaitPooled(t, rt, py("print(1)"))
	spec := py("b = bytearray(b'x') * (20 << 20)\nprint('small')")
	spec.Limits.MemoryMB = 32
	ctx := namespacesCtx(t, rt)
	res, err := rt.Run(ctx, Request{ID: job.NewID(), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	requireSucceeded(t, res, "small\n")
	// The job's own: its 20 MiB less what the cgroup gave back since the
	// baseline was read (page cache, freed import buffers), never the
	// preload's tens of MiB.
	if res.MemoryPeakBytes < 16<<20 || res.MemoryPeakBytes > 32<<20 {
		t.Errorf("peak memory %d MiB; want the job's own, between 16 and 32 MiB", res.MemoryPeakBytes>>20)
	}
	var st PoolStats
	for _, s := range rt.PoolStats() {
		if s.Runtime == "python" {
			st = s
		}
	}
	if st.Unfit != 0 || st.Hits < 1 {
		t.Errorf("pool %+v; want the job on the pooled sandbox (no unfit one)", st)
	}
}

// Removing a sandbox happens after the result; Close waits for it, and the
// pool leaves nothing behind in containerd.
func TestPoolLeavesNothingBehind(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	t.Parallel()
	base := setupConfig(t)
	base.WorkerID = testWorkerID + "-pool-" + randomHex(3)
	base.Pool = PoolConfig{Max: 2, Min: 2}
	base.Boxes.Off = true
	rt, err := New(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		awaitPooled(t, rt, py("print(1)"))
		requireSucceeded(t, run(t, rt, py("print(1)")), "1\n")
	}
	ctx := namespacesCtx(t, rt)
	if n := countContainers(t, rt, base.WorkerID); n < 1 {
		t.Errorf("%d containers of the pooled worker while it runs; want its idle sandboxes", n)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	check, err := New(ctx, setupConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	if n := countContainers(t, check, base.WorkerID); n != 0 {
		t.Errorf("%d containers left by the pooled worker after Close", n)
	}
}

func countContainers(t *testing.T, r *Containerd, workerID string) int {
	t.Helper()
	ctx := namespacesCtx(t, r)
	cs, err := r.client.Containers(ctx, "labels.\""+ctrd.LabelWorker+"\"=="+workerID)
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}

// The caller's span says whether the job's sandbox came from the pool.
func TestPoolSpanAttribute(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	cfg := setupConfig(t)
	cfg.WorkerID = testWorkerID + "-pool-" + randomHex(3)
	cfg.Pool = PoolConfig{Max: 1, Min: 1, Preload: map[string][]string{"python": nil}}
	cfg.Boxes.Off = true
	cfg.TracerProvider = tp
	rt := startRuntime(t, cfg)
	pooled := func() string {
		t.Helper()
		exp.Reset()
		ctx, parent := tp.Tracer("test").Start(t.Context(), "execute")
		res, err := rt.Run(ctx, Request{ID: job.NewID(), Spec: py("print(1)")})
		parent.End()
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("run: %v %s", err, res.Status)
		}
		for _, s := range exp.GetSpans() {
			if s.Name != "execute" {
				continue
			}
			for _, a := range s.Attributes {
				if a.Key == ktrace.SandboxPooledKey {
					return a.Value.Emit()
				}
			}
		}
		return "unset"
	}
	awaitPooled(t, rt, py("print(1)"))
	if got := pooled(); got != "true" {
		t.Errorf("a job on a pooled sandbox: %s = %s; want true", ktrace.SandboxPooledKey, got)
	}
	// Nothing idle of this class: a fresh sandbox.
	rt.pool.mu.Lock()
	var idle []*sandbox
	for _, st := range rt.pool.classes {
		idle, st.idle, st.target = append(idle, st.idle...), nil, 0
	}
	rt.pool.mu.Unlock()
	for _, sb := range idle {
		rt.ct.retire(namespacesCtx(t, rt), sb)
	}
	if got := pooled(); got != "false" {
		t.Errorf("a job on a fresh sandbox: %s = %s; want false", ktrace.SandboxPooledKey, got)
	}
}

// With the image's own preload list (the agent list: seconds of CPU to
// import), a job with the default limits takes the pooled sandbox: its
// CPU limit is armed on top of what the preloading used, which the
// sandbox was made with room for (raising RLIMIT_CPU's hard limit from
// outside needs CAP_SYS_RESOURCE, which a host may not give root).
func TestPoolImagePreloadServesDefaultJobs(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	t.Parallel()
	rt := setupPooled(t, PoolConfig{Max: 1, Min: 1})
	awaitPooled(t, rt, py("print(1)"))
	res := run(t, rt, py("print(1)"))
	requireSucceeded(t, res, "1\n")
	for _, st := range rt.PoolStats() {
		if st.Runtime == "python" && (st.Unfit != 0 || st.Hits == 0) {
			t.Errorf("pool %+v: want the job on the pooled sandbox, none unfit", st)
		}
	}
}
