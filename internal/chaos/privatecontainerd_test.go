package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images/archive"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/sandbox"
)

// privateContainerd is a containerd of one test's own, started by
// deploy/local/containerd.sh on a socket, root, state dir and config in a
// temporary directory, so the test can kill it without touching the
// containerd every other test package uses meanwhile.
type privateContainerd struct {
	t    testing.TB
	dir  string
	addr string
	env  []string
	pid  int // 0 while it is not running
}

var readyPID = regexp.MustCompile(`containerd \(pid (\d+)\) is ready`)

// startPrivateContainerd starts a private containerd, removed with
// everything it holds when the test ends. Without root or the pinned
// binaries the test is skipped (failed under KILN_INTEGRATION=require).
func startPrivateContainerd(t testing.TB) *privateContainerd {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "a private containerd needs root; running as uid %d", os.Geteuid())
	}
	binDir := cmp.Or(os.Getenv("KILN_CONTAINERD_BIN_DIR"), "/usr/local/lib/kiln")
	if _, err := os.Stat(filepath.Join(binDir, "containerd")); err != nil {
		if _, err := exec.LookPath("containerd"); err != nil {
			testenv.Unavailable(t, "no containerd binary in %s or on PATH (make deps)", binDir)
		}
	}
	for _, bin := range []string{"ctr", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Unavailable(t, "%s not on PATH (make deps)", bin)
		}
	}
	// Short: the shims' sockets are named after it.
	dir, err := os.MkdirTemp("", "kiln-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &privateContainerd{t: t, dir: dir, addr: filepath.Join(dir, "containerd.sock")}
	c.env = append(os.Environ(),
		"KILN_CONTAINERD_ADDRESS="+c.addr,
		"KILN_CONTAINERD_ROOT="+filepath.Join(dir, "root"),
		"KILN_CONTAINERD_STATE="+filepath.Join(dir, "state"),
		"KILN_LOG_DIR="+filepath.Join(dir, "log"),
		"KILN_STATE_DIR="+filepath.Join(dir, "etc"),
	)
	t.Cleanup(c.remove)
	c.start()
	return c
}

// start starts the daemon (again) on the same directories: a restart
// finds the tasks whose shims outlived the last one.
func (c *privateContainerd) start() {
	c.t.Helper()
	cmd := exec.Command("bash", "../../deploy/local/containerd.sh")
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

// kill SIGKILLs the daemon and waits until it is gone (its metadata lock
// goes with it). Its shims, and the sandboxes they hold, live on.
func (c *privateContainerd) kill() {
	if c.pid <= 0 {
		return
	}
	pid := c.pid
	c.pid = 0
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if !testkit.Poll(10*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		c.t.Errorf("containerd pid %d still there 10 s after SIGKILL", pid)
	}
}

// remove ends every task the daemon holds, then the daemon, and removes its
// directory.
func (c *privateContainerd) remove() {
	if c.pid > 0 {
		if err := c.endTasks(); err != nil {
			c.t.Logf("private containerd: end what is left: %v", err)
		}
	}
	c.kill()
	// A shim whose daemon is gone holds on to its task; nothing else
	// started by this daemon may outlive the test.
	for _, pid := range c.shims() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Overlay mounts of anything left go with the directory.
	_ = exec.Command("sh", "-c", "grep -o ' "+c.dir+"[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l").Run()
	if err := os.RemoveAll(c.dir); err != nil {
		c.t.Logf("private containerd: remove %s: %v", c.dir, err)
	}
}

// endTasks kills and deletes every task and container left in the private
// containerd (the workers' Close removed theirs unless the test failed).
func (c *privateContainerd) endTasks() error {
	cl, err := containerd.New(c.addr, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), sandbox.NamespaceDefault), time.Minute)
	defer cancel()
	cs, err := cl.Containers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ct := range cs {
		if task, err := ct.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("task %s: %w", ct.ID(), err))
			}
		}
		if err := ct.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("container %s: %w", ct.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// shims lists the pids of the shims this daemon started (their command
// line names its socket).
func (c *privateContainerd) shims() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), "containerd-shim") && strings.Contains(string(cmdline), c.addr) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// importImage copies image ref from the shared containerd (where `make
// image` put it) into the private one and unpacks it for the snapshotter:
// no archive on disk, and exactly the image the other suites run.
func (c *privateContainerd) importImage(ref string) {
	c.t.Helper()
	shared, err := containerd.New(testenv.Containerd(c.t), containerd.WithTimeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(c.t, "connect to the shared containerd: %v", err)
	}
	defer shared.Close()
	priv, err := containerd.New(c.addr, containerd.WithTimeout(5*time.Second))
	if err != nil {
		c.t.Fatalf("connect to the private containerd: %v", err)
	}
	defer priv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sctx := namespaces.WithNamespace(ctx, testenv.ContainerdNamespace())
	pctx := namespaces.WithNamespace(ctx, sandbox.NamespaceDefault)
	if _, err := shared.ImageService().Get(sctx, ref); err != nil {
		testenv.Unavailable(c.t, "image %s in the shared containerd (make image): %v", ref, err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(shared.Export(sctx, pw, archive.WithImage(shared.ImageService(), ref)))
	}()
	imgs, err := priv.Import(pctx, pr)
	pr.CloseWithError(io.ErrClosedPipe) // ends the export if the import stopped early
	if err != nil {
		c.t.Fatalf("import %s into the private containerd: %v", ref, err)
	}
	for _, img := range imgs {
		if img.Name != ref {
			continue
		}
		if err := containerd.NewImage(priv, img).Unpack(pctx, sandbox.SnapshotterDefault); err != nil {
			c.t.Fatalf("unpack %s in the private containerd: %v", ref, err)
		}
		return
	}
	c.t.Fatalf("import of %s gave %d images, none named %s", ref, len(imgs), ref)
}
