package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// kilnCmd runs the kiln binary with args against server (env: extra
// KEY=VALUE pairs; stdin: its input) and returns what it printed and its
// exit status.
func kilnCmd(t *testing.T, bin, server, stdin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KILN_SERVER="+server)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("kiln %v did not end within 3 minutes; stderr %s", args, errb.String())
	}
	return out.String(), errb.String(), exitCode(err)
}

// dataFrameAndChart is docs/api.md's display outputs example.
const dataFrameAndChart = `import pandas as pd, matplotlib.pyplot as plt
plt.plot([1, 4, 9])
pd.DataFrame({"a": [1, 2]})
`

// kiln run shows what a job made: the DataFrame's text printed, its HTML
// and the chart's PNG saved to --out as output-N, a line naming each.
func TestCLIRunShowsDisplayOutputs(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	e.startWorker(t, "w-cli-outputs", 1, withImages(map[string]string{"python": pythonImage(t)}))
	out := filepath.Join(t.TempDir(), "out")
	stdout, stderr, code := kilnCmd(t, bin, e.apiURL, dataFrameAndChart, nil, "run", "--out", out, "-")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, stderr)
	}
	if !strings.Contains(stdout, "   a\n0  1\n1  2") {
		t.Errorf("the DataFrame's text is not printed; stdout %q", stdout)
	}
	if strings.Contains(stdout, "<Figure") {
		t.Errorf("a figure's placeholder text is printed: %q", stdout)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	var png, html string
	for _, n := range names {
		switch filepath.Ext(n) {
		case ".png":
			png = n
		case ".html":
			html = n
		}
	}
	if png == "" || html == "" {
		t.Fatalf("--out holds %v; want the chart's output-N.png and the DataFrame's output-N.html", names)
	}
	if b, _ := os.ReadFile(filepath.Join(out, png)); !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("%s is not a PNG (%d bytes)", png, len(b))
	}
	if b, _ := os.ReadFile(filepath.Join(out, html)); !bytes.Contains(b, []byte("<table")) {
		t.Errorf("%s is not the DataFrame's HTML: %.200s", html, b)
	}
	for _, n := range []string{png, html} {
		if !strings.Contains(stderr, filepath.Join(out, n)) {
			t.Errorf("no line names %s; stderr %s", n, stderr)
		}
	}
	// Without --out, each is named with how to save it.
	_, stderr, _ = kilnCmd(t, bin, e.apiURL, dataFrameAndChart, nil, "run", "-")
	if !strings.Contains(stderr, "save it with --out DIR (as "+png+")") {
		t.Errorf("without --out: stderr %s", stderr)
	}
}

// kiln session runs a three-call flow: state kept between calls, a file
// written and read back, the sessions listed by tag, then ended.
func TestCLISession(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	e.startWorker(t, "w-cli-session", 1, withImages(map[string]string{"python": pythonImage(t)}))
	kiln := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return kilnCmd(t, bin, e.apiURL, stdin, nil, args...)
	}
	id, stderr, code := kiln("", "session", "new", "--tag", "agent=cli")
	id = strings.TrimSpace(id)
	if code != 0 || !job.ValidID(id) {
		t.Fatalf("session new: %q exit %d; stderr %s", id, code, stderr)
	}
	if _, stderr, code := kiln("", "session", "exec", id, "--code", "x = 41\nopen('n.txt', 'w').write('from the session')"); code != 0 {
		t.Fatalf("call 1: exit %d; stderr %s", code, stderr)
	}
	if out, stderr, code := kiln("print(x + 1)\n", "session", "exec", id, "-"); code != 0 || out != "42\n" {
		t.Fatalf("call 2: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, stderr, code := kiln("", "session", "exec", id, "--code", "import sys; print(x, file=sys.stderr); sys.exit(4)"); code != 4 || out != "" || !strings.Contains(stderr, "41") {
		t.Fatalf("call 3: stdout %q exit %d (want 4); stderr %s", out, code, stderr)
	}
	if out, stderr, code := kiln("", "session", "files", "get", id, "n.txt"); code != 0 || out != "from the session" {
		t.Errorf("files: %q exit %d; stderr %s", out, code, stderr)
	}
	if _, stderr, code := kiln("put in", "session", "files", "put", id, "-", "in.txt"); code != 0 {
		t.Errorf("files put: exit %d; stderr %s", code, stderr)
	}
	if out, _, _ := kiln("", "session", "exec", id, "--code", "print(open('in.txt').read())"); out != "put in\n" {
		t.Errorf("the file put: %q", out)
	}
	// Shell commands: a foreground one's output and exit code; a background
	// one's id, then its output and exit code once waited on.
	if out, stderr, code := kiln("", "session", "exec", id, "--cmd", "ls; exit 3"); code != 3 || !strings.Contains(out, "n.txt") {
		t.Fatalf("session exec --cmd: %q exit %d; stderr %s", out, code, stderr)
	}
	cid, stderr, code := kiln("", "session", "exec", id, "--cmd", "echo bg; sleep 1; exit 5", "--background")
	cid = strings.TrimSpace(cid)
	if code != 0 || !job.ValidCommandID(cid) {
		t.Fatalf("session exec --cmd --background: %q exit %d; stderr %s", cid, code, stderr)
	}
	if out, stderr, code := kiln("", "session", "exec", id, "--command-wait", cid, "--wait", "30s"); code != 5 || out != "bg\n" {
		t.Fatalf("session exec --command-wait: %q exit %d; stderr %s", out, code, stderr)
	}
	// One with its stdin open, fed from kiln's own stdin (more than one
	// write carries, in characters of three bytes), then --data with
	// --close; a write after the close fails, saying so; the list shows
	// both commands.
	fid, stderr, code := kiln("", "session", "exec", id, "--cmd", "cat > fed.txt; echo fed", "--background", "--open-stdin")
	fid = strings.TrimSpace(fid)
	if code != 0 || !job.ValidCommandID(fid) {
		t.Fatalf("session exec --cmd --background --open-stdin: %q exit %d; stderr %s", fid, code, stderr)
	}
	fed := strings.Repeat("€", 30_000) + "\n"
	if out, stderr, code := kiln(fed, "session", "exec", id, "--command-stdin", fid); code != 0 || out != "" {
		t.Fatalf("session exec --command-stdin from stdin: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, stderr, code := kiln("", "session", "exec", id, "--command-stdin", fid, "--data", "end\n", "--close"); code != 0 || out != "" {
		t.Fatalf("session exec --command-stdin --data --close: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, stderr, code := kiln("", "session", "exec", id, "--command-wait", fid, "--wait", "30s"); code != 0 || out != "fed\n" {
		t.Fatalf("session exec --command-wait of the fed command: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, stderr, _ := kiln("", "session", "exec", id, "--code", "print(open('fed.txt').read() == '€' * 30000 + '\\nend\\n')"); out != "True\n" {
		t.Errorf("what the command read is not what was fed: %q; stderr %s", out, stderr)
	}
	if _, stderr, code := kiln("", "session", "exec", id, "--command-stdin", fid, "--data", "late"); code != 1 || !strings.Contains(stderr, "no open stdin") {
		t.Errorf("session exec --command-stdin after the close: exit %d; stderr %s", code, stderr)
	}
	out, stderr, code := kiln("", "session", "exec", id, "--command-list")
	if want := []string{"ID STATE CMD", cid + " exit 5 echo bg; sleep 1; exit 5", fid + " exit 0 cat > fed.txt; echo fed"}; code != 0 ||
		!slices.Equal(strings.Split(strings.TrimSpace(regexp.MustCompile(` {2,}`).ReplaceAllString(out, " ")), "\n"), want) {
		t.Errorf("session exec --command-list: %q exit %d (want the lines %q); stderr %s", out, code, want, stderr)
	}
	if out, _, _ := kiln("", "session", "exec", id, "--command-list", "--json"); !strings.Contains(out, `"commands": [`) || !strings.Contains(out, `"cmd": "echo bg; sleep 1; exit 5"`) {
		t.Errorf("session exec --command-list --json: %s", out)
	}
	// A call that ended is left as it is by a cancel; one that does not exist is refused.
	if out, stderr, code := kiln("", "session", "cancel", id, "1"); code != 0 || out != id+" call 1 succeeded\n" {
		t.Errorf("session cancel of an ended call: %q exit %d; stderr %s", out, code, stderr)
	}
	if _, stderr, code := kiln("", "session", "cancel", id, "9999"); code != 1 || !strings.Contains(stderr, "no call") {
		t.Errorf("session cancel of no call: exit %d; stderr %s", code, stderr)
	}
	if _, _, code := kiln("", "session", "cancel", id, "x"); code != 2 {
		t.Errorf("session cancel ID x: exit %d; want 2 (usage)", code)
	}
	// Paused, the session keeps its files and variables; resumed, it says
	// what came back.
	if out, stderr, code := kiln("", "session", "pause", id); code != 0 || out != id+" paused\n" {
		t.Fatalf("session pause: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, _, _ := kiln("", "session", "ls", "--tag", "agent=cli"); !strings.Contains(out, "paused") {
		t.Errorf("session ls of a paused session: %q", out)
	}
	if out, stderr, code := kiln("", "session", "resume", id); code != 0 || !strings.HasPrefix(out, id+" ") ||
		!strings.Contains(out, "(restored: files+variables)") {
		t.Fatalf("session resume: %q exit %d; stderr %s", out, code, stderr)
	}
	if out, _, _ := kiln("", "session", "exec", id, "--code", "print(open('in.txt').read(), x)"); out != "put in 41\n" {
		t.Errorf("a call after resume: %q", out)
	}
	if out, _, code := kiln("", "session", "ls", "--tag", "agent=cli"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "agent=cli") {
		t.Errorf("session ls --tag agent=cli: %q", out)
	}
	if out, _, _ := kiln("", "session", "ls", "--tag", "agent=other"); strings.Contains(out, id) {
		t.Errorf("session ls --tag agent=other lists the session: %q", out)
	}
	if out, stderr, code := kiln("", "session", "rm", id); code != 0 || !strings.Contains(out, "ended") {
		t.Errorf("session rm: %q exit %d; stderr %s", out, code, stderr)
	}
	if _, stderr, code := kiln("", "session", "exec", id, "--code", "1"); code != 1 || !strings.Contains(stderr, "ended") {
		t.Errorf("a call after rm: exit %d; stderr %s", code, stderr)
	}
}

// kiln submit --wait mirrors the job's exit code; kiln list --status
// failed lists the failed job with its metadata; kiln cancel stops a
// running one; kiln runtimes lists python.
func TestCLIListCancelRuntimes(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	e.startWorker(t, "w-cli-list", 1)
	kiln := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		return kilnCmd(t, bin, e.apiURL, stdin, nil, args...)
	}
	out, stderr, code := kiln("import sys; sys.exit(3)\n", "submit", "--wait", "--no-cache", "--tag", "suite=cli", "-")
	if code != 3 || !strings.Contains(out, "status:   failed") {
		t.Fatalf("submit --wait of a job exiting 3: exit %d; stdout %s; stderr %s", code, out, stderr)
	}
	failedID := strings.Fields(strings.SplitN(out, "\n", 2)[0])[1]
	if _, _, code := kiln("print(1)\n", "submit", "--wait", "-"); code != 0 {
		t.Errorf("submit --wait of a job that succeeds: exit %d", code)
	}
	if _, _, code := kiln("", "get", failedID); code != 3 {
		t.Errorf("get of the failed job: exit %d, want 3", code)
	}
	out, stderr, code = kiln("", "list", "--status", "failed")
	if code != 0 || !strings.Contains(out, failedID) || !strings.Contains(out, "suite=cli") {
		t.Fatalf("list --status failed: exit %d; stdout %s; stderr %s", code, out, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) < 2 || f[1] != "failed" {
			t.Errorf("list --status failed shows %q", line)
		}
	}
	if out, _, _ := kiln("", "list", "--tag", "suite=cli", "--since", "1h"); !strings.Contains(out, failedID) {
		t.Errorf("list --tag suite=cli: %s", out)
	}
	if out, _, _ := kiln("", "list", "--tag", "suite=other"); strings.Contains(out, failedID) {
		t.Errorf("list --tag suite=other lists the job: %s", out)
	}

	out, stderr, code = kiln("import time\nprint('ready', flush=True)\ntime.sleep(120)\n", "submit", "--no-cache", "-")
	if code != 0 {
		t.Fatalf("submit: exit %d; stderr %s", code, stderr)
	}
	sleeper := strings.Fields(strings.SplitN(out, "\n", 2)[0])[1]
	e.waitRecord(t, sleeper, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	out, stderr, code = kiln("", "cancel", "--wait", sleeper)
	if code != 0 || !strings.Contains(out, sleeper+" canceled") {
		t.Errorf("cancel --wait: %q exit %d; stderr %s", out, code, stderr)
	}
	out, _, code = kiln("", "runtimes")
	if code != 0 || !strings.Contains(out, "python") || !strings.Contains(out, "sha256:") {
		t.Errorf("runtimes: %q exit %d", out, code)
	}
}

// Mistakes a new user makes are said plainly and at once: an API that is
// not there, a --server without its scheme, a missing or wrong key.
func TestCLIPlainErrors(t *testing.T) {
	bin := buildKiln(t)
	e := setup(t)
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		APIKeys: map[string]string{"k-cli": "cli"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	keyed := serveAPI(t, srv.Handler()).URL

	start := time.Now()
	_, stderr, code := kilnCmd(t, bin, "http://127.0.0.1:1", "print(1)", nil, "run", "-")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a refused connection took %v to report", took)
	}
	if code != 1 || !strings.Contains(stderr, "nothing answers at 127.0.0.1:1") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("refused: exit %d; stderr %q", code, stderr)
	}
	_, stderr, code = kilnCmd(t, bin, "127.0.0.1:8080", "", nil, "list")
	if code != 2 || !strings.Contains(stderr, "--server http://127.0.0.1:8080") || strings.Contains(stderr, "first path segment") {
		t.Errorf("scheme-less --server: exit %d; stderr %q", code, stderr)
	}
	_, stderr, code = kilnCmd(t, bin, keyed, "", []string{"KILN_API_KEY="}, "list")
	if code != 1 || !strings.Contains(stderr, "set KILN_API_KEY") {
		t.Errorf("no key: exit %d; stderr %q", code, stderr)
	}
	_, stderr, code = kilnCmd(t, bin, keyed, "", []string{"KILN_API_KEY=wrong"}, "list")
	if code != 1 || !strings.Contains(stderr, "refused the key in KILN_API_KEY") {
		t.Errorf("a wrong key: exit %d; stderr %q", code, stderr)
	}
	out, stderr, code := kilnCmd(t, bin, keyed, "", []string{"KILN_API_KEY=k-cli"}, "list")
	if code != 0 || !strings.HasPrefix(out, "ID") {
		t.Errorf("the right key: %q exit %d; stderr %s", out, code, fmt.Sprint(stderr))
	}
}
