package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// setupSessions is a runtime with boxes whose python image is the one
// this tree's recipe builds (kiln.local/python:<recipe hash>, made by
// `make image`): the session interpreter is in the image, and a build of
// another tree retagging :latest does not change what is tested.
func setupSessions(t *testing.T) *Containerd {
	t.Helper()
	return setupSessionsWith(t, func(*Config) {})
}

// setupSessionsWith is setupSessions with what edit changes in its
// configuration.
func setupSessionsWith(t *testing.T, edit func(*Config)) *Containerd {
	t.Helper()
	if underGVisor() {
		t.Skip("gVisor runtimes run a container per job")
	}
	cfg := boxConfig(setupConfig(t))
	cfg.Boxes = BoxConfig{wait: true}
	cfg.Images = map[string]string{"python": "kiln.local/python:" + recipeHash(t, "python")[:12]}
	cfg.Isolation = testIsolationOverride(cfg.Images)
	edit(&cfg)
	return startRuntime(t, cfg)
}

// recipeHash is deploy/images/build.sh's recipe_hash of deploy/images/name.
func recipeHash(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join("..", "deploy", "images", name)
	// Every regular file, in subfolders too, links followed, but Python's
	// bytecode caches: find -L . -name __pycache__ -prune -o -type f.
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return fs.SkipDir
		}
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			rel, _ := filepath.Rel(dir, path)
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	h := sha256.New()
	io.WriteString(h, "kiln-image-recipe-v2\n")
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "%s\x00%s\n", n, hex.EncodeToString(sum[:]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// openSession opens a session of tenant on rt, closed with the test.
func openSession(t *testing.T, rt *Containerd, tenant string, memMB int64) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := rt.openSession(ctx, SessionOptions{ID: job.NewID(), Tenant: tenant, Runtime: "python", MemoryMB: memMB})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// call runs code as the session's next call.
func call(t *testing.T, s *Session, code string, lim job.Limits) (job.Result, CallInfo) {
	t.Helper()
	base := Request{Tenant: "acme"}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, info, err := s.Exec(ctx, asRun(base, job.NewID(), job.Spec{Code: code, Limits: lim}))
	if err != nil {
		t.Fatalf("Exec %q: %v (result %+v)", code, err, res)
	}
	return res, info
}

func mustSucceed(t *testing.T, res job.Result, want string) {
	t.Helper()
	if res.Status != job.StatusSucceeded || strings.TrimSpace(res.Stdout) != want {
		t.Fatalf("got %s %.500q (stderr %.500q, error %+v), want succeeded %q", res.Status, res.Stdout, res.Stderr, res.Error, want)
	}
}

// Variables, imports, a DataFrame, the current directory and files in /work
// persist from call to call; each call's output is its own.
func TestSessionKeepsState(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 0)
	res, info := call(t, s, "x = 41\nimport pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\nopen('/work/notes.txt', 'w').write('kept')\nprint('one')", job.Limits{})
	mustSucceed(t, res, "one")
	if !info.Fresh || info.Ended {
		t.Fatalf("first call: %+v, want a fresh interpreter that lives on", info)
	}
	res, info = call(t, s, "print(x + 1)\nprint(open('notes.txt').read())", job.Limits{})
	mustSucceed(t, res, "42\nkept")
	if info.Fresh || info.Ended {
		t.Fatalf("second call: %+v, want the same interpreter", info)
	}
	res, _ = call(t, s, "import os\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')\nprint(int(df['a'].rolling(2).mean().iloc[-1] * 10))", job.Limits{})
	mustSucceed(t, res, "25")
	res, _ = call(t, s, "import os\nprint(os.getcwd())\nraise ValueError('boom')", job.Limits{})
	if res.Status != job.StatusFailed || strings.TrimSpace(res.Stdout) != "/work/sub" || !strings.Contains(res.Stderr, "ValueError: boom") {
		t.Fatalf("a failing call: %s %q %q", res.Status, res.Stdout, res.Stderr)
	}
	// A call's exception leaves the session as it was.
	res, _ = call(t, s, "print(x)", job.Limits{})
	mustSucceed(t, res, "41")
	var names []string
	err := s.WalkFiles(func(f SessionFile, open func() (*os.File, error)) error {
		names = append(names, f.Name)
		if f.Name == "notes.txt" {
			fh, err := open()
			if err != nil {
				return err
			}
			defer fh.Close()
			b, _ := io.ReadAll(fh)
			if string(b) != "kept" {
				t.Errorf("notes.txt holds %q", b)
			}
		}
		return nil
	})
	if err != nil || !strings.Contains(strings.Join(names, ","), "notes.txt") {
		t.Fatalf("WalkFiles: %v %v", names, err)
	}
}

// A call past its wall clock is interrupted; the interpreter and its state
// live on. A file put between calls is the next call's, the session's own.
func TestSessionTimeoutEndsOnlyTheCall(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 0)
	res, _ := call(t, s, "x = 41", job.Limits{})
	mustSucceed(t, res, "")
	res, info := call(t, s, "import time\nwhile True: time.sleep(0.01)", job.Limits{TimeoutMS: 1000})
	if res.Status != job.StatusTimedOut || info.Ended {
		t.Fatalf("a call past its timeout: %s %+v %+v", res.Status, res.Error, info)
	}
	if err := s.PutFile("in/data.csv", []byte("a\n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, info = call(t, s, "import os\nprint(x + 1, open('in/data.csv').read().split()[1], os.stat('in/data.csv').st_uid == os.getuid())", job.Limits{})
	mustSucceed(t, res, "42 1 True")
	if info.Fresh {
		t.Fatalf("the call after a timeout started a fresh interpreter")
	}
}

// A call whose context is canceled (its client went away, a cancel by
// request) is interrupted as a timeout is: canceled, the interpreter and
// its state live on.
func TestSessionCancelEndsOnlyTheCall(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 0)
	res, _ := call(t, s, "x = 41", job.Limits{})
	mustSucceed(t, res, "")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var once sync.Once
	req := Request{Tenant: "acme", ID: job.NewID(), Spec: job.Spec{Code: "import time\nprint('started', flush=True)\nwhile True: time.sleep(0.01)"},
		Output: func(stream string, p []byte) {
			if stream == "stdout" && strings.Contains(string(p), "started") {
				once.Do(cancel) // the call runs: its reader goes away
			}
		}}
	res, info, err := s.Exec(ctx, req)
	if err != nil || res.Status != job.StatusCanceled || info.Ended {
		t.Fatalf("a canceled call: %v %s %+v %+v", err, res.Status, res.Error, info)
	}
	res, info = call(t, s, "print(x + 1)", job.Limits{})
	mustSucceed(t, res, "42")
	if info.Fresh {
		t.Fatalf("the call after a cancel started a fresh interpreter")
	}
}

// A session whose box ended between calls (its zygote killed) refuses the
// next call as gone, with the session left to be brought back: the call
// never ran, so it is not judged as a call that ended (the session's
// sandbox ended before the call ran, and the caller may call again).
func TestSessionCallToAnEndedBoxIsNotRun(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 0)
	res, _ := call(t, s, "x = 41", job.Limits{})
	mustSucceed(t, res, "")
	pid := int(s.sb.task.Pid())
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the box's zygote (pid %d): %v", pid, err)
	}
	if !testkit.Poll(30*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		t.Fatal("the box's zygote did not end")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, info, err := s.Exec(ctx, Request{Tenant: "acme", ID: job.NewID(), Spec: job.Spec{Code: "open('ran', 'w')\nprint(x)"}})
	if !errors.Is(err, ErrSessionGone) || res.Status != "" {
		t.Fatalf("a call to an ended box: %v, %s %+v %+v; want ErrSessionGone and no judged result", err, res.Status, res.Error, info)
	}
	t.Logf("a call to an ended box: %v", err)
	if err := s.WalkFiles(func(f SessionFile, _ func() (*os.File, error)) error {
		if f.Name == "ran" {
			t.Errorf("the call to an ended box left %s in /work: it ran", f.Name)
		}
		return nil
	}); err != nil {
		t.Fatalf("WalkFiles: %v", err)
	}
	if _, _, err := s.Exec(ctx, Request{Tenant: "acme", ID: job.NewID(), Spec: job.Spec{Code: "print(1)"}}); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("the call after: %v; want ErrSessionGone", err)
	}
}

// The session's memory cap ends the interpreter: that call is oom_killed,
// the next one runs in a fresh interpreter without the old state.
func TestSessionMemoryCapRestarts(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 256)
	res, _ := call(t, s, "x = 41", job.Limits{})
	mustSucceed(t, res, "")
	res, info := call(t, s, "b = bytearray(1 << 30)", job.Limits{})
	if res.Status != job.StatusOOMKilled || !info.Ended {
		t.Fatalf("a call past the session's memory: %s %+v %+v", res.Status, res.Error, info)
	}
	res, info = call(t, s, "print('x' in globals())", job.Limits{})
	mustSucceed(t, res, "False")
	if !info.Fresh || !s.Alive() {
		t.Fatalf("the call after an OOM: %+v, alive %v", info, s.Alive())
	}
}

// A session's box is its own: a job of the same tenant never runs in it,
// two sessions never share one, and closing a session removes its box.
func TestSessionBoxIsItsOwn(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	a := openSession(t, rt, "acme", 0)
	b := openSession(t, rt, "acme", 0)
	if a.ContainerID() == b.ContainerID() {
		t.Fatalf("two sessions share box %s", a.ContainerID())
	}
	ra, _ := call(t, a, boxOf, job.Limits{})
	rb, _ := call(t, b, boxOf, job.Limits{})
	rj := runAs(t, rt, "acme", py(boxOf))
	if ra.Stdout == rb.Stdout || ra.Stdout == rj.Stdout || rb.Stdout == rj.Stdout {
		t.Fatalf("work dirs shared: session a %q, session b %q, job %q", ra.Stdout, rb.Stdout, rj.Stdout)
	}
	// A process the call leaves behind stays the session's; it cannot see
	// the other session's processes or files.
	res, _ := call(t, a, "import os\nprint(sorted(os.listdir('/work')))", job.Limits{})
	if strings.Contains(res.Stdout, "main.py") {
		t.Fatalf("session a sees a job's files: %q", res.Stdout)
	}
	a.Close(t.Context())
	ctx := namespacesCtx(t, rt)
	if err := rt.Settle(ctx); err != nil { // removal runs in the background
		t.Fatal(err)
	}
	if _, err := rt.client.LoadContainer(ctx, a.ContainerID()); err == nil {
		t.Fatalf("box %s of a closed session is still in containerd", a.ContainerID())
	}
	if _, _, err := a.Exec(t.Context(), Request{ID: job.NewID(), Spec: job.Spec{Code: "print(1)"}}); err == nil {
		t.Fatalf("a closed session ran a call")
	}
}

// Once a runtime has served a session, the next session's box is made
// ahead of demand: the next session takes it, labelled as its own, and it
// serves that session alone.
func TestSessionTakesTheSpareBox(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	first := openSession(t, rt, "acme", 0)
	if err := rt.Settle(t.Context()); err != nil { // the spare is made like a removal: Settle waits for it
		t.Fatal(err)
	}
	rt.box.spares.mu.Lock()
	spare := rt.box.spares.ready["python"]
	rt.box.spares.mu.Unlock()
	if spare == nil {
		t.Fatal("no spare session box after the first session")
	}
	second := openSession(t, rt, "globex", 0)
	if second.ContainerID() != spare.id || second.ContainerID() == first.ContainerID() {
		t.Fatalf("the second session's box %s; the spare was %s", second.ContainerID(), spare.id)
	}
	c, err := rt.client.LoadContainer(namespacesCtx(t, rt), second.ContainerID())
	if err != nil {
		t.Fatal(err)
	}
	labels, err := c.Labels(namespacesCtx(t, rt))
	if err != nil || labels[ctrd.LabelSession] == "" {
		t.Fatalf("the spare taken is not labelled with its session: %v %v", labels, err)
	}
	res, _ := call(t, second, "x = 1\nprint(x)", job.Limits{})
	mustSucceed(t, res, "1")
}

// A session brought back (Restore) with no spare ready gets a lean box:
// nothing preloaded, so it is made in a fraction of a preloaded box's time,
// and what it imports works as in a cold interpreter. One with a spare
// ready takes the spare, preloaded.
func TestSessionRestoreBoxIsLean(t *testing.T) {
	t.Parallel()
	rt := setupSessionsWith(t, func(c *Config) { c.Pool.Preload = map[string][]string{"python": {"numpy", "pandas"}} })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	probe := "import sys\nprint('pandas' in sys.modules, 'numpy' in sys.modules)"
	lean, err := rt.openSession(ctx, SessionOptions{ID: job.NewID(), Tenant: "acme", Runtime: "python", Restore: true})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { lean.Close(context.Background()) })
	res, _ := call(t, lean, probe, job.Limits{})
	mustSucceed(t, res, "False False")
	res, _ = call(t, lean, "import pandas as pd\nprint(pd.DataFrame({'a': [1, 2]}).a.sum())", job.Limits{})
	mustSucceed(t, res, "3")
	if err := rt.Settle(t.Context()); err != nil { // the spare made behind it
		t.Fatal(err)
	}
	warm, err := rt.openSession(ctx, SessionOptions{ID: job.NewID(), Tenant: "acme", Runtime: "python", Restore: true})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { warm.Close(context.Background()) })
	res, _ = call(t, warm, probe, job.Limits{})
	mustSucceed(t, res, "True True")
}

// A call returns display outputs as a job does: the last expression's value,
// display(), a figure shown with plt.show(); and a structured exception.
func TestSessionCallDisplayOutputs(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	s := openSession(t, rt, "acme", 0)
	res, _ := call(t, s, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf", job.Limits{})
	if res.Status != job.StatusSucceeded || len(res.Outputs) != 1 || res.Outputs[0].Type != "execute_result" {
		t.Fatalf("last expression: %s %+v\n%s", res.Status, res.Outputs, res.Stderr)
	}
	if _, ok := res.Outputs[0].Data["text/html"]; !ok {
		t.Fatalf("the DataFrame's output has no text/html: %v", res.Outputs[0].Data)
	}
	res, _ = call(t, s, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\ndisplay(df.a.sum())\nx = 1", job.Limits{})
	var kinds []string
	for _, o := range res.Outputs {
		kinds = append(kinds, o.Type)
		if o.Type == "display_data" && len(o.Data) > 0 {
			if _, ok := o.Data["image/png"]; ok {
				kinds[len(kinds)-1] += "+png"
			}
		}
	}
	if res.Status != job.StatusSucceeded || strings.Join(kinds, ",") != "display_data+png,display_data" {
		t.Fatalf("figure and display(): %s %v\n%s", res.Status, kinds, res.Stderr)
	}
	res, _ = call(t, s, "1 / 0", job.Limits{})
	if res.Status != job.StatusFailed || res.Error == nil || res.Error.Exception == nil || res.Error.Exception.Type != "ZeroDivisionError" {
		t.Fatalf("exception: %s %+v", res.Status, res.Error)
	}
	// The state is still there, and a call without output has none.
	res, _ = call(t, s, "y = len(df)", job.Limits{})
	if res.Status != job.StatusSucceeded || len(res.Outputs) != 0 {
		t.Fatalf("assignment: %s %+v", res.Status, res.Outputs)
	}
}
