package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"go.uber.org/goleak"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/jail"
)

// testWorkerID labels this package's containers apart from a real worker's.
const testWorkerID = "sandbox-test"

// setup returns a runtime on the real containerd, skipping (or failing under
// KILN_INTEGRATION=require) when containerd or the python image is missing.
func setup(t testing.TB) *Containerd {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with tweak applied to the configuration of the path
// under test before the runtime starts.
func setupWith(t testing.TB, tweak func(*Config)) *Containerd {
	t.Helper()
	cfg := setupConfig(t)
	switch {
	case testPooled():
		cfg = pooledConfig(cfg)
	case testFresh():
		cfg.Boxes.Off = true
	default:
		cfg = boxConfig(cfg)
	}
	if tweak != nil {
		tweak(&cfg)
	}
	rt := startRuntime(t, cfg)
	if _, err := rt.Image(t.Context(), "python"); err != nil {
		testenv.Unavailable(t, "python sandbox image: %v (run `make image`)", err)
	}
	return rt
}

// startRuntime makes a runtime of cfg, starts it (its pool, if any) and
// closes it when the test ends.
func startRuntime(t testing.TB, cfg Config) *Containerd {
	t.Helper()
	rt, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	if err := rt.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return rt
}

// setupConfig is setup's configuration: the real containerd, this suite's
// worker id and kiln-init, and a container per job (the fallback path; a
// test of boxes turns them on with boxConfig).
func setupConfig(t testing.TB) Config {
	t.Helper()
	addr := testenv.Containerd(t)
	return Config{
		Address:   addr,
		Namespace: testenv.ContainerdNamespace(),
		WorkerID:  testWorkerID,
		Init:      testInit,
		Isolation: testIsolationOverride(ImagesDefault()),
		Runsc:     os.Getenv("KILN_RUNSC"), // "": RunscDefault
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Boxes:     BoxConfig{Off: true},
	}
}

// testIsolation is the isolation this run of the suite tests under:
// KILN_SANDBOX_ISOLATION ("runc", the default, or "gvisor"). Under gvisor
// every runtime is forced onto runsc through Config.Isolation, so the same
// probes and hostile programs run against gVisor's kernel.
func testIsolation() Isolation {
	iso, err := parseIsolation(os.Getenv("KILN_SANDBOX_ISOLATION"))
	if err != nil {
		panic("KILN_SANDBOX_ISOLATION: " + err.Error())
	}
	return iso
}

// testIsolationOverride is Config.Isolation for a test runtime serving images.
func testIsolationOverride(images map[string]string) map[string]string {
	iso := testIsolation()
	if iso == IsolationRunc {
		return nil
	}
	m := map[string]string{}
	for rt := range images {
		m[rt] = string(iso)
	}
	return m
}

// underGVisor reports whether the suite runs under gVisor; tests use it to
// expect gVisor's own answer where its kernel differs from the host's.
func underGVisor() bool { return testIsolation() == IsolationGVisor }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runs counts run's box jobs, to alternate their tenants.
var runs atomic.Int64

// run runs code with the given limits (zero fields: defaults) and fails the
// test on a platform error.
func run(t testing.TB, rt *Containerd, spec job.Spec) job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var hits int64
	c, pooled := rt, true
	boxed := false
	if pooled && testBox() && !underGVisor() && c.box.boxCfg.wait && !c.box.boxCfg.Off {
		img, err := c.images.resolve(namespacesCtx(t, c), spec.Runtime)
		boxed = err == nil && img.profile.Box
	}
	if pooled = pooled && c.pool.enabled() && !underGVisor(); pooled {
		hits = awaitPooled(t, c, spec)
	}
	var before BoxStats
	req := Request{ID: job.NewID(), Spec: spec}
	if boxed {
		// Tenants alternate, so consecutive jobs in a box are of
		// different tenants: every box suite checks what a job leaves
		// for the next one across tenants.
		req.Tenant = []string{"tenant-a", "tenant-b"}[runs.Add(1)%2]
		before = c.BoxStats()
	}
	res, err := rt.Run(ctx, req)
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	if pooled && poolHits(c, spec.Runtime) <= hits {
		t.Errorf("the job did not run on a pooled sandbox (pool %+v)", c.PoolStats())
	}
	if after := c.BoxStats(); boxed && after.Hits+after.Claims <= before.Hits+before.Claims && (res.Error == nil || res.Error.Category != job.CategoryInvalidRequest) {
		t.Errorf("the job did not run in a box (%+v)", after)
	}
	return res
}

// asRun is base (its tenant and callbacks) made the request of run id of
// spec.
func asRun(base Request, id string, spec job.Spec) Request {
	base.ID, base.Spec = id, spec
	return base
}

func py(code string) job.Spec { return job.Spec{Runtime: "python", Code: code} }

// requireSucceeded fails unless res is a success printing want on stdout.
func requireSucceeded(t testing.TB, res job.Result, want string) {
	t.Helper()
	if res.Status != job.StatusSucceeded || res.Stdout != want {
		t.Fatalf("want succeeded with stdout %q; got status %s, exit %d, error %+v\nstdout: %q\nstderr: %s",
			want, res.Status, res.Code(), res.Error, res.Stdout, res.Stderr)
	}
}

// healthy runs a normal job and requires it to work: after anything hostile
// the runtime must still serve the next job.
func healthy(t testing.TB, rt *Containerd) {
	t.Helper()
	requireSucceeded(t, run(t, rt, py("print(6*7)")), "42\n")
}

// testInit is kiln-init built from this checkout by TestMain, so the suite
// tests the init it ships with, not whatever is installed on the host.
var testInit string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kiln-init-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The directory must be reachable by runc for the bind mount.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testInit = filepath.Join(dir, "kiln-init")
	// The jail library of this checkout, for every runtime of the suite
	// (and the worker processes it starts) that makes boxes.
	testJail := filepath.Join(dir, jail.LibraryName)
	if err := os.Setenv(EnvJail, testJail); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// KILN_TEST_INIT and KILN_TEST_JAIL: kiln-init and the jail library
	// already built from this checkout, for a test binary run where there
	// is no toolchain to build them with (deploy/local/cgroup2-vm.sh's
	// guest).
	if prebuilt := os.Getenv("KILN_TEST_INIT"); prebuilt != "" {
		if err := copyFile(prebuilt, testInit, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "KILN_TEST_INIT: %v\n", err)
			return 1
		}
		if err := copyFile(os.Getenv("KILN_TEST_JAIL"), testJail, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "KILN_TEST_JAIL: %v\n", err)
			return 1
		}
		return runLeakChecked(m)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", testInit, "../cmd/kiln-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kiln-init: %v\n%s", err, out)
		return 1
	}
	if err := jail.Build(context.Background(), testJail); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return runLeakChecked(m)
}

// runLeakChecked runs the tests, then fails the run if a goroutine outlives
// them (goleak.VerifyTestMain, which would exit before testMain's clean-up).
func runLeakChecked(m *testing.M) int {
	if code := m.Run(); code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
		return 1
	}
	return 0
}

func TestRunHello(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py("import sys\nprint('hello', sys.argv[1:], input())")
	spec.Args = []string{"a", "b"}
	spec.Stdin = "from stdin\n"
	res := run(t, rt, spec)
	requireSucceeded(t, res, "hello ['a', 'b'] from stdin\n")
	if res.Image.Name != "kiln.local/python:latest" || !strings.HasPrefix(res.Image.Digest, "sha256:") {
		t.Errorf("image = %+v", res.Image)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 || res.Limits == nil || res.Limits.MemoryMB != job.DefaultLimits.MemoryMB {
		t.Errorf("exit code %v, limits %+v", res.ExitCode, res.Limits)
	}
	if res.CPUMS <= 0 || res.MemoryPeakBytes <= 1<<20 || res.WallMS <= 0 {
		t.Errorf("cpu_ms %d, memory_peak_bytes %d, wall_ms %d: want all positive", res.CPUMS, res.MemoryPeakBytes, res.WallMS)
	}
	t.Logf("wall %d ms, cpu %d ms, peak %d bytes", res.WallMS, res.CPUMS, res.MemoryPeakBytes)
}

func namespacesCtx(t testing.TB, rt *Containerd) context.Context {
	return namespaces.WithNamespace(t.Context(), rt.cfg.Namespace)
}

// settle waits for the sandbox removals under way: a result comes before its
// sandbox is gone.
func settle(t testing.TB, rt *Containerd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := rt.Settle(ctx); err != nil {
		t.Fatal(err)
	}
}
