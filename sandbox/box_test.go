package sandbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// The suite's sandbox path (KILN_SANDBOX_PATH): unset or "box", every python
// job in a fresh inner sandbox of a box (the default path); "fresh", a
// container per job (the fallback); "pooled", a container per job prepared
// ahead of it (pool_test.go).
func testFresh() bool { return os.Getenv("KILN_SANDBOX_PATH") == "fresh" }

// testBox reports whether setup's runtime runs python jobs in boxes (not
// under gVisor, whose runtimes keep a container per job).
func testBox() bool { return !testFresh() && !testPooled() && !underGVisor() }

// onlyItsOwnProcs reports whether procs, the pids a job's /proc lists (in
// order), are what its path shows it: in a box, its own process alone
// (pid 2; pid 1 is the namespace's reaper, not the job's, and hidden); in
// a container, kiln-init (pid 1) and its own process.
func onlyItsOwnProcs(procs []int) bool {
	switch {
	case testBox():
		return len(procs) == 1 && procs[0] == 2
	case underGVisor():
		// A pid namespace of the job's own: its launcher is pid 1.
		return len(procs) == 1 && procs[0] == 1
	}
	return len(procs) == 2 && procs[0] == 1
}

// onlyItsOwnWant says what onlyItsOwnProcs wants, for a failure message.
func onlyItsOwnWant() string {
	switch {
	case testBox():
		return "only its own process (pid 2)"
	case underGVisor():
		return "only its own process (pid 1 of its own pid namespace)"
	}
	return "only kiln-init (pid 1) and its own process"
}

// boxConfig turns cfg into a runtime whose python jobs all run in boxes (a
// job that finds no box waits for one): its own worker id and no preloading,
// so a job with a small memory limit fits.
func boxConfig(cfg Config) Config {
	cfg.WorkerID = testWorkerID + "-box-" + randomHex(3)
	cfg.Boxes = BoxConfig{wait: true}
	cfg.Pool.Preload = map[string][]string{"python": nil, "python-slim": nil}
	return cfg
}

// setupBoxes is a runtime with boxes configured as bc (waited for).
func setupBoxes(t *testing.T, bc BoxConfig) *Containerd {
	t.Helper()
	if underGVisor() {
		t.Skip("gVisor runtimes run a container per job")
	}
	cfg := boxConfig(setupConfig(t))
	bc.wait = true
	cfg.Boxes = bc
	return startRuntime(t, cfg)
}

// runAs runs spec as tenant's job.
func runAs(t testing.TB, rt *Containerd, tenant string, spec job.Spec) job.Result {
	t.Helper()
	base := Request{Tenant: tenant}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := rt.Run(ctx, asRun(base, job.NewID(), spec))
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	return res
}

// boxOf prints what names the box (or container) a job ran in: the device
// of its work dir, the host tmpfs one box holds for all its jobs.
const boxOf = "import os; print(os.stat('/work').st_dev)"

// Consecutive jobs of a tenant run in the same box, each in a sandbox of
// its own: its own uid, its own pid namespace in which it sees only its
// own processes, no capabilities.
func TestBoxRunsEachJobFresh(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	probe := py(boxOf + `
print(os.getuid(), os.getpid(), os.getppid())
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print(st['CapEff'].strip(), st['CapPrm'].strip(), st['CapBnd'].strip(), st['NoNewPrivs'].strip(), st['Seccomp'].strip())
print(sorted(os.listdir('/run/kiln')))
`)
	var boxes, uids []string
	for range 3 {
		res := runAs(t, rt, "acme", probe)
		if res.Status != job.StatusSucceeded {
			t.Fatalf("probe: %s %+v\n%s", res.Status, res.Error, res.Stderr)
		}
		l := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		boxes = append(boxes, l[0])
		f := strings.Fields(l[1])
		uids = append(uids, f[0])
		// pid 1 is the namespace's reaper; the parent is the zygote, in
		// the box's pid namespace, which no pid of the job's names.
		if f[1] != "2" || f[2] != "0" {
			t.Errorf("pid %s parent %s; want 2, its parent outside its pid namespace (0)", f[1], f[2])
		}
		if l[2] != "[2]" {
			t.Errorf("processes seen: %s; want only itself (the reaper, pid 1, is not the job's)", l[2])
		}
		if l[3] != "0000000000000000 0000000000000000 0000000000000000 1 2" {
			t.Errorf("CapEff CapPrm CapBnd NoNewPrivs Seccomp: %s; want no capabilities, no_new_privs, a filter", l[3])
		}
		if l[4] != "[]" {
			t.Errorf("/run/kiln holds %s; want nothing of the box's", l[4])
		}
	}
	if boxes[0] != boxes[1] || boxes[1] != boxes[2] {
		t.Errorf("3 jobs of one tenant ran in boxes %v; want one box", boxes)
	}
	if uids[0] == uids[1] || uids[1] == uids[2] {
		t.Errorf("job uids %v; want a fresh uid per job", uids)
	}
	if st := rt.BoxStats(); st.Hits < 2 || st.Prepared < 2 {
		t.Errorf("box stats %+v; want the 2nd and 3rd job as hits, each in a sandbox made ahead of it", st)
	}
}

// A box's next sandbox is made ahead of its job with the limits of the job
// before; a job with other limits discards it and gets one made for it, and
// the job after that finds one made with its limits.
func TestBoxPreparedSandboxFitsItsJob(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	probe := func(cpuMS int64) job.Spec {
		s := py(boxOf + "\nimport resource; print(resource.getrlimit(resource.RLIMIT_CPU)[0])")
		s.Limits.CPUMS = cpuMS
		return s
	}
	var boxes []string
	for i, c := range []struct {
		cpuMS              int64
		prepared, discards int64
	}{{2000, 0, 0}, {5000, 0, 1}, {5000, 1, 1}} {
		res := runAs(t, rt, "acme", probe(c.cpuMS))
		if res.Status != job.StatusSucceeded {
			t.Fatalf("job %d: %s %+v\n%s", i, res.Status, res.Error, res.Stderr)
		}
		l := strings.Fields(res.Stdout)
		boxes = append(boxes, l[0])
		if want := strconv.FormatInt((c.cpuMS+999)/1000, 10); l[1] != want {
			t.Errorf("job %d (cpu_ms %d): RLIMIT_CPU %s s; want %s", i, c.cpuMS, l[1], want)
		}
		if st := rt.BoxStats(); st.Prepared != c.prepared || st.Discarded != c.discards {
			t.Errorf("after job %d: box stats %+v; want %d prepared, %d discarded", i, st, c.prepared, c.discards)
		}
	}
	t.Logf("boxes %v, stats %+v", boxes, rt.BoxStats())
	if boxes[0] != boxes[1] || boxes[1] != boxes[2] {
		t.Errorf("jobs ran in boxes %v; want one box", boxes)
	}
}

// A box outlives its jobs: a job is not written into the box's labels, so
// the box's deadline stays its own life and reaping never takes an idle box
// whose last job's wall-clock limit has passed (it did: every box idle for
// longer than its last job's timeout was reaped, and the tenant's next jobs
// ran in containers of their own).
func TestBoxKeepsItsOwnDeadline(t *testing.T) {
	t.Parallel()
	if !testBox() {
		t.Skip("the box path's labels")
	}
	rt := setupBoxes(t, BoxConfig{})
	spec := py("print(1)")
	spec.Limits.TimeoutMS = 1000
	requireSucceeded(t, runAs(t, rt, "acme", spec), "1\n")
	var sb *sandbox
	if idle := rt.box.boxes.Idle(); len(idle) > 0 {
		sb = idle[0]
	}
	if sb == nil {
		t.Fatalf("no idle box after the job: %+v", rt.BoxStats())
	}
	if sb.labelled != nil {
		<-sb.labelled
	}
	labels, err := sb.container.Labels(namespaces.WithNamespace(t.Context(), rt.cfg.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(labels[ctrd.LabelDeadline], 10, 64)
	if err != nil || labels[ctrd.LabelJobID] != "" || time.Until(time.UnixMilli(ms)) < rt.box.boxCfg.MaxAge-time.Minute {
		t.Fatalf("the idle box's labels %v: want no job id and its own life as deadline (%s)", labels, rt.box.boxCfg.MaxAge)
	}
}

// A box of a tenant with dedicated boxes is never used by another tenant,
// whatever the interleaving. A job's box is named by its container id, read
// while the job runs (its first output): a device number would do only
// while no box retires, since the kernel hands a retired box's tmpfs device
// to the next mount.
func TestBoxDedicatedTenantsNeverShare(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{Max: 4})
	var mu sync.Mutex
	owner := map[string]string{} // box container id -> tenant
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				tenant := []string{"acme", "globex"}[(w+i)%2]
				id := job.NewID()
				var once sync.Once
				box := ""
				req := Request{ID: id, Spec: py("print(1)"), Tenant: tenant, DedicatedBoxes: true, Output: func(string, []byte) {
					once.Do(func() {
						if sb, ok := rt.box.running.Load(id); ok {
							box = sb.(*sandbox).id
						}
					})
				}}
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
				res, err := rt.Run(ctx, req)
				cancel()
				if err != nil || res.Status != job.StatusSucceeded {
					t.Errorf("%s: %s %+v, err %v", tenant, res.Status, res.Error, err)
					return
				}
				if box == "" {
					t.Errorf("%s: job %s was not seen running in a box", tenant, id)
					return
				}
				mu.Lock()
				if o, ok := owner[box]; ok && o != tenant {
					t.Errorf("box %s served %s and %s", box, o, tenant)
				}
				owner[box] = tenant
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st := rt.BoxStats(); st.Hits+st.Claims < 24 {
		t.Errorf("box stats %+v: want every job in a box", st)
	}
}

// By default a box serves every tenant, one job at a time, each in a fresh
// inner sandbox: jobs of tenants taken in turn on one slot all run in the
// box the first of them claimed, so the speed of the default path does not
// depend on how many tenants there are.
func TestBoxServesEveryTenant(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{Max: 4})
	boxes := map[string]bool{}
	for i := range 8 {
		tenant := fmt.Sprintf("tenant-%d", i)
		id := job.NewID()
		var once sync.Once
		box := ""
		req := Request{ID: id, Spec: py("print(1)"), Tenant: tenant, Output: func(string, []byte) {
			once.Do(func() {
				if sb, ok := rt.box.running.Load(id); ok {
					box = sb.(*sandbox).id
				}
			})
		}}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		res, err := rt.Run(ctx, req)
		cancel()
		if err != nil || res.Status != job.StatusSucceeded || box == "" {
			t.Fatalf("%s: %s %+v, box %q, err %v", tenant, res.Status, res.Error, box, err)
		}
		boxes[box] = true
	}
	if st := rt.BoxStats(); len(boxes) != 1 || st.Hits < 7 {
		t.Fatalf("8 tenants in turn ran in %d boxes (%+v); want one box, taken again by every tenant after the first", len(boxes), st)
	}
}

// A box job's output dir comes back as its artifacts, and the next job in
// the same box starts with an empty one.
func TestBoxArtifacts(t *testing.T) {
	t.Parallel()
	rt := setupBoxes(t, BoxConfig{})
	st := &testkit.MemStore{}
	base := Request{Tenant: "acme", Store: st.Put}
	ctx := t.Context()
	run := func(code string) job.Result {
		t.Helper()
		res, err := rt.Run(ctx, asRun(base, job.NewID(), py(code)))
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("%v: %s %+v\n%s", err, res.Status, res.Error, res.Stderr)
		}
		return res
	}
	first := run(`import os; open(os.environ["KILN_OUTPUT_DIR"] + "/first.txt", "w").write("one")` + "\n" + boxOf)
	second := run(`import os; print(sorted(os.listdir(os.environ["KILN_OUTPUT_DIR"])))
open(os.environ["KILN_OUTPUT_DIR"] + "/second.txt", "w").write("two")` + "\n" + boxOf)
	if first.Stdout == "" || !strings.HasSuffix(second.Stdout, first.Stdout) {
		t.Fatalf("the jobs ran in different boxes: %q, %q", first.Stdout, second.Stdout)
	}
	if !strings.HasPrefix(second.Stdout, "[]\n") {
		t.Errorf("job 2's output dir at its start: %q; want empty", second.Stdout)
	}
	if len(first.Artifacts) != 1 || first.Artifacts[0].Name != "first.txt" || string(st.Get(first.Artifacts[0].SHA256)) != "one" {
		t.Errorf("job 1's artifacts: %+v", first.Artifacts)
	}
	if len(second.Artifacts) != 1 || second.Artifacts[0].Name != "second.txt" {
		t.Errorf("job 2's artifacts: %+v; want second.txt alone", second.Artifacts)
	}
}
