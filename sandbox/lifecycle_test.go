package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// leftovers lists what containerd still holds for workerID: containers and
// snapshots by label, tasks by container id (a container id starts with its
// job id).
func leftovers(t *testing.T, rt *Containerd, workerID string, jobIDs ...string) []string {
	t.Helper()
	ctx := namespacesCtx(t, rt)
	filter := fmt.Sprintf(`labels.%q==%q`, ctrd.LabelWorker, workerID)
	var out []string
	cs, err := rt.client.Containers(ctx, filter)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range cs {
		out = append(out, "container "+c.ID())
		ids[c.ID()] = true
	}
	err = rt.client.SnapshotService(rt.cfg.Snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		out = append(out, "snapshot "+info.Name)
		return nil
	}, filter)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := rt.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tl.Tasks {
		if ids[p.ID] || slices.ContainsFunc(jobIDs, func(id string) bool { return strings.HasPrefix(p.ID, id+"-") }) {
			out = append(out, "task "+p.ID)
		}
	}
	return out
}

// TestNoLeftovers runs 200 jobs one after another, hostile ones among them,
// with their own worker id, then lists containerd's containers, tasks and
// snapshots: none may remain.
func TestNoLeftovers(t *testing.T) {
	t.Parallel()
	// Unique per run: another test process on the host (two `go test` runs)
	// must not show up as this run's leftovers. Set before the runtime
	// starts: its boxes are labelled and filed under it.
	rt := setupWith(t, func(c *Config) { c.WorkerID = "sandbox-leak-test-" + job.NewID() })
	kinds := []job.Spec{
		py("print(1)"),
		py("import sys; sys.exit(3)"),
		py("print("),
		py("raise ValueError('x')"),
		py("import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(100)\nprint('bye')"),
		py("import sys; sys.stdout.write('y' * 3000000)"),
		{Runtime: "python", Code: "bytearray(100 << 20)", Limits: job.Limits{MemoryMB: 32}},
		{Runtime: "python", Code: "while True: pass", Limits: job.Limits{TimeoutMS: 200}},
	}
	statuses := map[job.Status]int{}
	var ids []string
	for i := range 200 {
		spec := kinds[i%len(kinds)]
		ids = append(ids, job.NewID())
		res, err := rt.Run(t.Context(), Request{ID: ids[i], Spec: spec})
		if err != nil {
			t.Fatalf("job %d (%q): %v", i, spec.Code, err)
		}
		statuses[res.Status]++
		// Every byte a finished program wrote arrives, however fast it exited.
		switch i % len(kinds) {
		case 0:
			if res.Stdout != "1\n" {
				t.Errorf("job %d print(1): stdout %q", i, res.Stdout)
			}
		case 4:
			if res.Stdout != "bye\n" {
				t.Errorf("job %d double fork: stdout %q", i, res.Stdout)
			}
		case 5:
			if res.StdoutBytes != 3000000 {
				t.Errorf("job %d: %d bytes of stdout counted, want 3000000", i, res.StdoutBytes)
			}
		}
	}
	t.Logf("statuses: %v", statuses)
	if statuses[job.StatusTimedOut] != 25 || statuses[job.StatusOOMKilled] != 25 || statuses[job.StatusSucceeded] != 75 || statuses[job.StatusFailed] != 75 {
		t.Errorf("statuses %v: want 25 timed_out, 25 oom_killed, 75 succeeded, 75 failed", statuses)
	}
	settle(t, rt)
	// The runtime's own boxes live on while it runs: closing it retires
	// them, and then nothing may be left.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	lister, err := New(t.Context(), setupConfig(t)) // rt's connection is closed
	if err != nil {
		t.Fatal(err)
	}
	defer lister.Close()
	if left := leftovers(t, lister, rt.cfg.WorkerID, ids...); len(left) > 0 {
		t.Fatalf("left in containerd after 200 jobs: %q", left)
	}
}

// TestParallelIsolation runs four jobs at once; none may see another's files
// or processes. Each job records when it ran so the test can prove they
// overlapped.
func TestParallelIsolation(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	const n = 4
	type report struct {
		Start, End float64
		Work, Tmp  []string
		Procs      []int
	}
	reports := make([]report, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			spec := py(fmt.Sprintf(`
import json, os, time
start = time.time()
open("/work/mine-%[1]d", "w").write("x")
open("/tmp/mine-%[1]d", "w").write("x")
time.sleep(3)  # long enough that four container starts on a busy host still overlap
print(json.dumps({"start": start, "end": time.time(), "work": sorted(os.listdir("/work")), "tmp": sorted(os.listdir("/tmp")),
                  "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
`, i))
			res, err := rt.Run(t.Context(), Request{ID: job.NewID(), Spec: spec})
			if err != nil || res.Status != job.StatusSucceeded {
				errs <- fmt.Errorf("job %d: %v %s %+v %s", i, err, res.Status, res.Error, res.Stderr)
				return
			}
			if err := json.Unmarshal([]byte(res.Stdout), &reports[i]); err != nil {
				errs <- fmt.Errorf("job %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	latestStart, earliestEnd := 0.0, 1e18
	for i, r := range reports {
		latestStart, earliestEnd = max(latestStart, r.Start), min(earliestEnd, r.End)
		if want := []string{"main.py", fmt.Sprintf("mine-%d", i), "out"}; !slices.Equal(r.Work, want) {
			t.Errorf("job %d /work: %q; want %q", i, r.Work, want)
		}
		if want := []string{fmt.Sprintf("mine-%d", i)}; !slices.Equal(r.Tmp, want) {
			t.Errorf("job %d /tmp: %q; want %q", i, r.Tmp, want)
		}
		if !onlyItsOwnProcs(r.Procs) {
			t.Errorf("job %d sees processes %v; want %s", i, r.Procs, onlyItsOwnWant())
		}
	}
	if latestStart >= earliestEnd {
		t.Fatalf("the jobs did not overlap in time (latest start %.3f, earliest end %.3f); the test proved nothing", latestStart, earliestEnd)
	}
}

// TestBadInput: invalid specs are refused with an *job.InvalidError before
// anything runs; odd but valid ones give well-defined results.
func TestBadInput(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	tests := []struct {
		name  string
		id    string
		spec  job.Spec
		field string
		msg   string
	}{
		{"empty code", "", job.Spec{Code: "  \n"}, "code", "empty"},
		{"unknown runtime", "", job.Spec{Runtime: "ruby", Code: "puts 1"}, "runtime", "known runtimes: python"},
		{"memory above max", "", job.Spec{Code: "print(1)", Limits: job.Limits{MemoryMB: 1 << 20}}, "limits.memory_mb", "maximum"},
		{"negative timeout", "", job.Spec{Code: "print(1)", Limits: job.Limits{TimeoutMS: -5}}, "limits.timeout_ms", "positive"},
		{"negative pids", "", job.Spec{Code: "print(1)", Limits: job.Limits{Pids: -1}}, "limits.pids", "positive"},
		{"file escaping", "", job.Spec{Code: "print(1)", Files: []job.File{{Name: "../etc/passwd", Content: "x"}}}, "files[0].name", ".."},
		{"bad base64", "", job.Spec{Code: "print(1)", Files: []job.File{{Name: "f", Content: "%%", Encoding: "base64"}}}, "files[0].content", "base64"},
		{"reserved env", "", job.Spec{Code: "print(1)", Env: map[string]string{"PATH": "/evil"}}, "env", "reserved"},
		{"id unusable as a container name", "../x", job.Spec{Code: "print(1)"}, "id", "container"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := cmpOr(tt.id, job.NewID())
			res, err := rt.Run(t.Context(), Request{ID: id, Spec: tt.spec})
			var inv *job.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("err = %v; want an *job.InvalidError", err)
			}
			if inv.Field != tt.field || !strings.Contains(inv.Message, tt.msg) {
				t.Errorf("invalid %s: %s; want field %s mentioning %q", inv.Field, inv.Message, tt.field, tt.msg)
			}
			if res.Error == nil || res.Error.Category != job.CategoryInvalidRequest || res.Error.Retryable {
				t.Errorf("result error %+v; want invalid_request, not retryable", res.Error)
			}
		})
	}
	if left := leftovers(t, rt, rt.cfg.WorkerID); slices.ContainsFunc(left, func(s string) bool { return strings.Contains(s, "../x") }) {
		t.Errorf("an invalid job left %q", left)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestNonUTF8Output: bytes that are not UTF-8 come back as valid JSON text
// with U+FFFD and the exact bytes in base64.
func TestNonUTF8Output(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res := run(t, rt, py(`import sys; sys.stdout.buffer.write(b"ok\xff\xfe\n"); sys.stderr.buffer.write(b"\x80")`))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	b, err := json.Marshal(res)
	if err != nil || !json.Valid(b) {
		t.Fatalf("result JSON: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(res.StdoutBase64)
	if err != nil || string(raw) != "ok\xff\xfe\n" || res.Stdout != "ok\uFFFD\n" {
		t.Fatalf("stdout %q base64 %q (%q, %v)", res.Stdout, res.StdoutBase64, raw, err)
	}
	if raw, _ := base64.StdEncoding.DecodeString(res.StderrBase64); string(raw) != "\x80" {
		t.Fatalf("stderr base64 %q", res.StderrBase64)
	}
}

// TestProgramErrors: how Python failures are reported, as CPython would
// print them, with no launcher frames.
func TestProgramErrors(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	tests := []struct {
		code     string
		status   job.Status
		category job.Category
		exit     int
		stderr   []string // substrings
		msg      string
	}{
		{"print('a'\n", job.StatusFailed, job.CategorySyntaxError, 1, []string{`File "/work/main.py", line 1`, "SyntaxError: '(' was never closed"}, "SyntaxError"},
		{"if True:\nprint(1)\n", job.StatusFailed, job.CategorySyntaxError, 1, []string{"IndentationError"}, "IndentationError"},
		{"def f():\n    return 1 / 0\nf()\n", job.StatusFailed, job.CategoryRuntimeError, 1, []string{"Traceback (most recent call last):\n  File \"/work/main.py\", line 3, in <module>", "ZeroDivisionError: division by zero"}, "ZeroDivisionError"},
		{"import torch\n", job.StatusFailed, job.CategoryRuntimeError, 1, []string{"No module named 'torch'"}, `module "torch" is not installed in the python runtime's image`},
		{"import sys\nsys.exit(7)\n", job.StatusFailed, job.CategoryRuntimeError, 7, nil, "code 7"},
		{"raise SystemExit('bye')\n", job.StatusFailed, job.CategoryRuntimeError, 1, []string{"bye"}, "bye"},
		{"import sys\nsys.exit(0)\n", job.StatusSucceeded, "", 0, nil, ""},
	}
	for _, tt := range tests {
		res := run(t, rt, py(tt.code))
		if res.Status != tt.status || res.Code() != tt.exit {
			t.Errorf("%q: %s exit %d; want %s exit %d\n%s", tt.code, res.Status, res.Code(), tt.status, tt.exit, res.Stderr)
			continue
		}
		if strings.Contains(res.Stderr, "launch.py") {
			t.Errorf("%q: launcher frames in the traceback:\n%s", tt.code, res.Stderr)
		}
		for _, s := range tt.stderr {
			if !strings.Contains(res.Stderr, s) {
				t.Errorf("%q: stderr lacks %q:\n%s", tt.code, s, res.Stderr)
			}
		}
		if tt.category == "" {
			continue
		}
		if res.Error == nil || res.Error.Category != tt.category || !strings.Contains(res.Error.Message, tt.msg) {
			t.Errorf("%q: error %+v; want %s mentioning %q", tt.code, res.Error, tt.category, tt.msg)
		}
	}
}

// TestInputs: args, env, stdin continuing after the frame, input files in
// subdirectories, and modules shipped as files importing from /work.
func TestInputs(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(`
import os, sys, helper
data = sys.stdin.buffer.read()
print(sys.argv, os.environ["GREETING"], helper.VALUE, open("data/in.csv").read().strip(), len(data), data[:5], __name__)
`)
	spec.Args = []string{"--n", "3"}
	spec.Env = map[string]string{"GREETING": "hi"}
	spec.Stdin = "KILN/1 9\n" + strings.Repeat("s", 300_000) // looks like a frame: must reach the program untouched
	spec.Files = []job.File{
		{Name: "helper.py", Content: "VALUE = 42\n"},
		{Name: "data/in.csv", Content: base64.StdEncoding.EncodeToString([]byte("a,b\n1,2\n")), Encoding: "base64"},
	}
	res := run(t, rt, spec)
	requireSucceeded(t, res, "['main.py', '--n', '3'] hi 42 a,b\n1,2 300009 b'KILN/' __main__\n")
}

// TestReapOrphans leaves a prepared sandbox behind, as a crashed worker
// would, and checks ReapOrphans removes it and nothing of another worker.
func TestReapOrphans(t *testing.T) {
	t.Parallel()
	cfg := setupConfig(t)
	cfg.WorkerID = "sandbox-reap-test-" + job.NewID()
	rt := startRuntime(t, cfg)
	ctx := namespacesCtx(t, rt)
	img, err := rt.images.resolve(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := rt.ct.prepare(ctx, img, prepOpts{jobID: job.NewID(), lim: job.DefaultLimits})
	if err != nil {
		cleanup(ctx, sb)
		t.Fatal(err)
	}
	if !strings.HasSuffix(sb.cgroupsPath, "/"+sb.id) {
		t.Errorf("captured cgroups path %q does not name the container %s", sb.cgroupsPath, sb.id)
	}
	// Never delivered, never cleaned: the launcher waits on stdin for ever.
	// A crashed predecessor's sandbox: this runtime does not own it.
	rt.live.track(sb.id, false)
	if left := leftovers(t, rt, rt.cfg.WorkerID); len(left) < 2 {
		t.Fatalf("the abandoned sandbox is not visible: %q", left)
	}
	if n, err := rt.ReapOrphans(t.Context(), "some-other-worker"); err != nil || n != 0 {
		t.Fatalf("reap for another worker: %d, %v; want 0", n, err)
	}
	n, err := rt.ReapOrphans(t.Context(), rt.cfg.WorkerID)
	if err != nil || n != 1 {
		t.Fatalf("ReapOrphans = %d, %v; want 1", n, err)
	}
	if left := leftovers(t, rt, rt.cfg.WorkerID); len(left) > 0 {
		t.Fatalf("after reaping: %q", left)
	}
	if _, err := rt.ReapOrphans(t.Context(), ""); err == nil {
		t.Fatal("ReapOrphans without a worker id must refuse")
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if st, err := sb.task.Status(ctx2); err == nil && st.Status == containerd.Running {
		t.Fatal("the orphan's task still runs")
	}
	sb.stdinR.Close()
}

// TestImagePackages: the image's scientific stack works under the sandbox
// profile (threads, mmap, the narrowed seccomp filter, a read-only root with
// matplotlib's cache in /tmp).
func TestImagePackages(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(`
import threading
import numpy, pandas, matplotlib
import matplotlib.pyplot as plt
plt.plot([1, 2, 3]); plt.savefig("/tmp/plot.png")
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(int(numpy.arange(10).sum()), int(pandas.DataFrame({"a": [1, 2]}).a.sum()), matplotlib.get_backend().lower())
`)
	spec.Limits.TimeoutMS = 60_000
	requireSucceeded(t, run(t, rt, spec), "45 3 agg\n")
}

// Every job mounts its image's one shared read-only root view: running jobs
// creates no snapshot, and the view is a GC root labelled with its chain.
func TestSharedRootView(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	ctx := namespacesCtx(t, rt)
	img, err := rt.images.resolve(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	if img.rootfs != ctrd.RootfsKey(img.chainID) {
		t.Fatalf("image entry root view %q, want %q", img.rootfs, ctrd.RootfsKey(img.chainID))
	}
	sn := rt.client.SnapshotService(rt.cfg.Snapshotter)
	info, err := sn.Stat(ctx, img.rootfs)
	if err != nil {
		t.Fatalf("shared root view: %v", err)
	}
	if info.Kind != snapshots.KindView || info.Parent != img.chainID || info.Labels[ctrd.LabelRootfs] != img.chainID ||
		info.Labels["containerd.io/gc.root"] == "" {
		t.Fatalf("shared root view %+v: want a view of %s, labelled, a GC root", info, img.chainID)
	}
	// While a job runs, its container's root is the shared view.
	id := job.NewID()
	done := make(chan job.Result, 1)
	go func() {
		res, _ := rt.Run(t.Context(), Request{ID: id, Spec: py("import time; time.sleep(2); print('ok')")})
		done <- res
	}()
	var key string
	testkit.Eventually(t, 20*time.Second, "the job's container", func() bool {
		// A container of its own carries the job's id; a box does not
		// (its labels are its own life's), and says which job it runs.
		filter := fmt.Sprintf("labels.%q==%q", ctrd.LabelJobID, id)
		if box := rt.box.boxOfJob(id); box != "" {
			filter = fmt.Sprintf("id==%s", box)
		}
		cs, err := rt.client.Containers(ctx, filter)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 1 {
			ci, err := cs[0].Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			key = ci.SnapshotKey
		}
		return key != ""
	})
	requireSucceeded(t, <-done, "ok\n")
	if key != img.rootfs {
		t.Fatalf("the job's container mounted snapshot %q, want the shared view %q", key, img.rootfs)
	}
	if _, err := sn.Stat(ctx, img.rootfs); err != nil {
		t.Fatalf("the shared view is gone after a job: %v", err)
	}
}

// pruneRootfs removes root views no image has any more, unless a container
// still mounts them; the current image's view stays.
func TestPruneRootViews(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	ctx := namespacesCtx(t, rt)
	img, err := rt.images.resolve(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	sn := rt.client.SnapshotService(rt.cfg.Snapshotter)
	suffix := strings.ToLower(strings.ReplaceAll(job.NewID(), "-", ""))
	stale, inUse := ctrd.RootfsKey("sha256:stale"+suffix), ctrd.RootfsKey("sha256:inuse"+suffix)
	for _, key := range []string{stale, inUse} {
		labels := map[string]string{ctrd.LabelManaged: "true", ctrd.LabelRootfs: "sha256:gone", "containerd.io/gc.root": "x"}
		if _, err := sn.View(ctx, key, img.chainID, snapshots.WithLabels(labels)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sn.Remove(namespaces.WithNamespace(context.Background(), rt.cfg.Namespace), key) })
	}
	cid := "prune-test-" + suffix
	c, err := rt.client.NewContainer(ctx, cid, ctrd.WithRootfs(rt.cfg.Snapshotter, inUse, img.ref),
		containerd.WithNewSpec(ctrd.SpecOpts(ctrd.Profile{Args: img.args, Limits: job.DefaultLimits})...))
	if err != nil {
		t.Fatal(err)
	}
	// Not t.Context(): it is canceled before cleanups run.
	t.Cleanup(func() { _ = c.Delete(namespaces.WithNamespace(context.Background(), rt.cfg.Namespace)) })

	if _, err := rt.ct.be.PruneRootfs(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Stat(ctx, stale); err == nil {
		t.Error("a root view of no image, mounted by no container, was kept")
	}
	if _, err := sn.Stat(ctx, inUse); err != nil {
		t.Errorf("a root view a container mounts was removed: %v", err)
	}
	if _, err := sn.Stat(ctx, img.rootfs); err != nil {
		t.Errorf("the current image's root view was removed: %v", err)
	}
}
