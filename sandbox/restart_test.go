package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/snapshots"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// privateContainerd is a containerd of this test's own (started by
// deploy/local/containerd.sh on a socket, root and state dir in a temp dir),
// so it can be killed without touching the one every other test uses.
type privateContainerd struct {
	t    *testing.T
	env  []string
	addr string
	pid  int
}

var readyPID = regexp.MustCompile(`containerd \(pid (\d+)\) is ready`)

func startPrivateContainerd(t *testing.T) *privateContainerd {
	t.Helper()
	testenv.Containerd(t) // skips (or fails under require) without containerd and root
	dir, err := os.MkdirTemp("", "kiln-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &privateContainerd{t: t, addr: filepath.Join(dir, "containerd.sock")}
	c.env = append(os.Environ(),
		"KILN_CONTAINERD_ADDRESS="+c.addr,
		"KILN_CONTAINERD_ROOT="+filepath.Join(dir, "root"),
		"KILN_CONTAINERD_STATE="+filepath.Join(dir, "state"),
		"KILN_LOG_DIR="+filepath.Join(dir, "log"),
		"KILN_STATE_DIR="+filepath.Join(dir, "etc"),
		// The image goes where pooledConfig looks for it, whatever namespace
		// the suite runs in on the shared containerd.
		"KILN_CONTAINERD_NAMESPACE="+NamespaceDefault,
	)
	c.start()
	t.Cleanup(func() {
		c.kill()
		// Overlay mounts of anything left die with the dir.
		_ = exec.Command("sh", "-c", "grep -o ' "+dir+"[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l").Run()
		os.RemoveAll(dir)
	})
	// The python-slim image from the build cache (make image built it).
	cmd := exec.Command("bash", "../deploy/images/build.sh", "python-slim")
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "import python-slim into a private containerd: %v\n%s", err, out)
	}
	return c
}

// pooledConfig is a runtime on c serving python-slim with a pool of 2, with
// a worker id of its own (tag names the test).
func (c *privateContainerd) pooledConfig(t *testing.T, tag string) Config {
	cfg := setupConfig(t)
	cfg.Address = c.addr
	cfg.Namespace = NamespaceDefault
	cfg.WorkerID = testWorkerID + "-" + tag + "-" + randomHex(3)
	cfg.Images = map[string]string{"python-slim": "kiln.local/python-slim:latest"}
	cfg.Isolation = nil
	cfg.Pool = PoolConfig{Max: 2, Min: 2}
	cfg.Boxes.Off = true
	return cfg
}

func (c *privateContainerd) start() {
	c.t.Helper()
	cmd := exec.Command("bash", "../deploy/local/containerd.sh")
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("start a private containerd: %v\n%s", err, out)
	}
	m := readyPID.FindSubmatch(out)
	if m == nil {
		c.t.Fatalf("containerd.sh did not say which pid it started:\n%s", out)
	}
	c.pid, _ = strconv.Atoi(string(m[1]))
}

func (c *privateContainerd) kill() {
	if c.pid > 0 {
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
		// Until it is gone: its metadata lock goes with it.
		pid := c.pid
		testkit.Poll(2*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		c.pid = 0
	}
}

// Killing containerd under load and starting it again loses no job (a job
// running at the kill ends once containerd is back, its sandbox outliving
// the daemon; one that could not get a sandbox meanwhile is run again, as
// the worker's hold would), the pool rebuilds, and afterwards containerd
// holds exactly the pool's containers and tasks, and no snapshot but the
// image's shared root.
func TestPoolSurvivesContainerdRestart(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	c := startPrivateContainerd(t)
	rt := startRuntime(t, c.pooledConfig(t, "restart"))

	const jobs = 30
	var done, retries atomic.Int64
	var mu sync.Mutex
	var failures []string
	killAt := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < jobs && ctx.Err() == nil {
				res, err := rt.Run(ctx, Request{ID: job.NewID(), Spec: job.Spec{Runtime: "python-slim", Code: "print(1)"}})
				if err != nil || res.Status == job.StatusInternalError {
					retries.Add(1) // a platform fault: the worker would run it again
					time.Sleep(200 * time.Millisecond)
					continue
				}
				if res.Status != job.StatusSucceeded || res.Stdout != "1\n" {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s %q %+v", res.Status, res.Stdout, res.Error))
					mu.Unlock()
				}
				if done.Add(1) == 8 {
					once.Do(func() { close(killAt) })
				}
			}
		}()
	}
	select {
	case <-killAt:
	case <-ctx.Done():
		t.Fatal("the first 8 jobs did not finish")
	}
	before := retries.Load()
	c.kill()
	// Down until the load has met the outage: a run failed for want of it,
	// or 5 s passed (both runs at the kill may be waiting for their task's
	// exit, which only containerd gives).
	testkit.Poll(5*time.Second, func() bool { return retries.Load() > before })
	c.start()
	wg.Wait()
	if done.Load() < jobs || len(failures) > 0 {
		t.Fatalf("%d of %d jobs done; failures: %q", done.Load(), jobs, failures)
	}
	t.Logf("%d jobs done, %d runs retried after the restart", done.Load(), retries.Load())

	// The pool rebuilds and containerd holds exactly what it owns.
	nctx := namespacesCtx(t, rt)
	var idle, extra []string
	if !testkit.Poll(2*time.Minute, func() bool {
		idle, extra = poolAccount(t, rt, nctx)
		return len(idle) == 2 && len(extra) == 0
	}) {
		t.Fatalf("2 minutes after the restart: pool holds %v; containerd also has %q (%+v)", idle, extra, rt.PoolStats())
	}
	t.Logf("afterwards: the pool's %d sandboxes and nothing else", len(idle))
}

// poolAccount returns the pool's idle sandboxes and what containerd holds
// besides them: containers, tasks and active snapshots.
func poolAccount(t *testing.T, rt *Containerd, ctx context.Context) (idle []string, extra []string) {
	t.Helper()
	rt.pool.mu.Lock()
	for _, st := range rt.pool.classes {
		for _, sb := range st.idle {
			idle = append(idle, sb.id)
		}
	}
	rt.pool.mu.Unlock()
	cs, err := rt.client.Containers(ctx)
	if err != nil {
		return idle, []string{"list containers: " + err.Error()}
	}
	for _, c := range cs {
		if !slices.Contains(idle, c.ID()) {
			extra = append(extra, "container "+c.ID())
		}
	}
	tasks, err := rt.client.TaskService().List(ctx, nil)
	if err != nil {
		return idle, append(extra, "list tasks: "+err.Error())
	}
	for _, tk := range tasks.Tasks {
		if !slices.Contains(idle, tk.ID) {
			extra = append(extra, "task "+tk.ID)
		}
	}
	err = rt.client.SnapshotService(rt.cfg.Snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind != snapshots.KindCommitted && !strings.HasPrefix(info.Name, ctrd.RootfsKey("")) {
			extra = append(extra, "snapshot "+info.Name)
		}
		return nil
	})
	if err != nil {
		extra = append(extra, "list snapshots: "+err.Error())
	}
	return idle, extra
}

// A rebuilt image replaces the pool's idle sandboxes: once the runtime's
// image reference points at a new digest, the idle sandboxes of the old one
// are removed and new ones prepared from the new image.
func TestPoolReplacedWhenTheImageChanges(t *testing.T) {
	if underGVisor() {
		t.Skip("gVisor sandboxes are not pooled")
	}
	c := startPrivateContainerd(t)
	// A second image to point python-slim's reference at: any other digest
	// will do (node's launcher waits on stdin just the same).
	cmd := exec.Command("bash", "../deploy/images/build.sh", "node")
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "import node into a private containerd: %v\n%s", err, out)
	}
	rt := startRuntime(t, c.pooledConfig(t, "image"))
	ctx := namespacesCtx(t, rt)
	digests := func() (idle []string) {
		rt.pool.mu.Lock()
		defer rt.pool.mu.Unlock()
		for _, st := range rt.pool.classes {
			for _, sb := range st.idle {
				idle = append(idle, sb.img.digest.String())
			}
		}
		return idle
	}
	waitFor := func(what string, ok func([]string) bool) {
		t.Helper()
		if !testkit.Poll(time.Minute, func() bool { return ok(digests()) }) {
			t.Fatalf("%s: idle sandboxes of %v", what, digests())
		}
	}
	old, err := rt.client.ImageService().Get(ctx, "kiln.local/python-slim:latest")
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the pool did not fill", func(d []string) bool { return len(d) == 2 })
	node, err := rt.client.ImageService().Get(ctx, "kiln.local/node:latest")
	if err != nil {
		t.Fatal(err)
	}
	// "Rebuild": the reference now names another digest.
	img := old
	img.Target = node.Target
	if _, err := rt.client.ImageService().Update(ctx, img, "target"); err != nil {
		t.Fatal(err)
	}
	want := node.Target.Digest.String()
	waitFor("the pool kept sandboxes of the replaced image", func(d []string) bool {
		return len(d) == 2 && d[0] == want && d[1] == want
	})
	if err := rt.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if idle, extra := poolAccount(t, rt, ctx); len(extra) > 0 {
		t.Errorf("besides the pool's %v, containerd holds %q", idle, extra)
	}
}
