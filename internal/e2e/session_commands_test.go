package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// Issue 36, acceptance 5 (commands), through the API, a worker and the real
// sandbox: `pip list` and `ls -la` in /work; a command's exit code, stderr
// and env; a command printing a line a second seen live over SSE before it
// ends; a timeout that ends the command and not the session; a background
// command waited on, and one killed (a later call's timeout does not reach
// it); an unknown command id is 404; the interpreter's variables are
// untouched by it all.
func TestSessionCommands(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-commands", 1, withImages(map[string]string{"python": pythonImage(t)}))
	s := a.create("k-a", map[string]any{})
	base := "/v1/sessions/" + s.ID + "/commands"
	answer := func(method, path string, body any, want int) job.CallResult {
		t.Helper()
		code, raw := a.do("k-a", method, path, body)
		if code != want {
			t.Fatalf("%s %s: %d %s; want %d", method, path, code, raw, want)
		}
		var r job.CallResult
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
		return r
	}
	ended := func(r job.CallResult, exit int) {
		t.Helper()
		if r.Command == nil || r.Command.Running || r.Command.ExitCode == nil || *r.Command.ExitCode != exit ||
			r.ExitCode == nil || *r.ExitCode != exit {
			t.Fatalf("call %d: command %+v exit %v; want ended with %d (stdout %q stderr %q)", r.Seq, r.Command, r.ExitCode, exit, r.Stdout, r.Stderr)
		}
	}
	wantOut(t, a.exec("k-a", s.ID, "x = 41\nopen('made.txt', 'w').write('made')"), "")

	r := answer("POST", base+"?wait=60s", map[string]any{"cmd": "pip list"}, http.StatusOK)
	ended(r, 0)
	if r.Status != job.StatusSucceeded || !strings.Contains(r.Stdout, "pandas") || !strings.Contains(r.Stdout, "numpy") {
		t.Fatalf("pip list: %s %q %q", r.Status, r.Stdout, r.Stderr)
	}
	r = answer("POST", base+"?wait=60s", map[string]any{"cmd": "pwd; ls -la"}, http.StatusOK)
	ended(r, 0)
	if !strings.HasPrefix(r.Stdout, "/work\n") || !strings.Contains(r.Stdout, "made.txt") || !strings.Contains(r.Stdout, " ..\n") {
		t.Fatalf("pwd; ls -la: %q", r.Stdout)
	}
	r = answer("POST", base+"?wait=60s", map[string]any{"cmd": "echo $GREETING >&2; echo out > by-cmd.txt; exit 3", "env": map[string]string{"GREETING": "hi"}}, http.StatusOK)
	ended(r, 3)
	if r.Status != job.StatusFailed || r.Stderr != "hi\n" {
		t.Fatalf("exit 3: %s stderr %q", r.Status, r.Stderr)
	}
	wantOut(t, a.exec("k-a", s.ID, "import os\nprint(open('by-cmd.txt').read().strip(), x, os.environ.get('GREETING'))"), "out 41 None")

	// A line a second, seen as it is written: the first line arrives while
	// the command still has seconds to run.
	code, raw := a.do("k-a", "POST", base, map[string]any{"cmd": "for i in 1 2 3 4 5; do echo line $i; sleep 1; done"})
	var acc job.CallPending
	if code != http.StatusAccepted || json.Unmarshal(raw, &acc) != nil || acc.Links.Events == "" {
		t.Fatalf("a command without wait: %d %s", code, raw)
	}
	req, _ := http.NewRequest("GET", a.base+acc.Links.Events, nil)
	req.Header.Set("Authorization", "Bearer k-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var lines []time.Time
	var stdout strings.Builder
	var result job.CallResult
	var resultAt time.Time
	typ := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && typ == "stdout":
			var ev struct {
				Data string `json:"data"`
			}
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev)
			stdout.WriteString(ev.Data)
			for range strings.Count(ev.Data, "\n") {
				lines = append(lines, time.Now())
			}
		case strings.HasPrefix(line, "data: ") && typ == job.EventResult:
			resultAt = time.Now()
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &result); err != nil {
				t.Fatalf("result event: %v", err)
			}
		}
	}
	resp.Body.Close()
	if stdout.String() != "line 1\nline 2\nline 3\nline 4\nline 5\n" || len(lines) != 5 || resultAt.IsZero() {
		t.Fatalf("streamed %q (%d lines), result %+v", stdout.String(), len(lines), result)
	}
	if gap := resultAt.Sub(lines[0]); gap < 3*time.Second {
		t.Fatalf("the first line came %v before the command ended: not live", gap)
	}
	ended(result, 0)

	// A background command to kill, started before a call that times out:
	// the timeout's interrupt does not reach it.
	bg := answer("POST", base+"?wait=60s", map[string]any{"cmd": "echo up; exec sleep 300", "background": true}, http.StatusOK)
	if bg.Command == nil || !bg.Command.Running || bg.Command.ID != strconv.FormatInt(bg.Seq, 10) || bg.Status != job.StatusSucceeded {
		t.Fatalf("a background command: %+v %s", bg.Command, bg.Status)
	}
	start := time.Now()
	r = answer("POST", base+"?wait=60s", map[string]any{"cmd": "sleep 30", "timeout_s": 2}, http.StatusOK)
	if r.Status != job.StatusTimedOut || time.Since(start) > 20*time.Second {
		t.Fatalf("sleep 30 with timeout_s 2: %s after %v (%+v)", r.Status, time.Since(start), r.Error)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(x)"), "41")
	r = answer("GET", base+"/"+bg.Command.ID, nil, http.StatusOK)
	if r.Command == nil || !r.Command.Running || r.Stdout != "up\n" {
		t.Fatalf("the background command after another call timed out: %+v %q", r.Command, r.Stdout)
	}
	r = answer("POST", base+"/"+bg.Command.ID+"/kill", nil, http.StatusOK)
	if r.Command == nil || r.Command.Running || !r.Command.Killed || r.Command.ExitCode == nil || *r.Command.ExitCode != 137 {
		t.Fatalf("kill: %+v", r.Command)
	}

	// One waited on: its output and exit code once it ends.
	bg = answer("POST", base+"?wait=60s", map[string]any{"cmd": "echo start; sleep 2; echo done >&2; exit 7", "background": true}, http.StatusOK)
	r = answer("GET", base+"/"+bg.Command.ID+"?wait=30s", nil, http.StatusOK)
	if r.Command == nil || r.Command.Running || r.Command.ExitCode == nil || *r.Command.ExitCode != 7 ||
		r.Stdout != "start\n" || r.Stderr != "done\n" {
		t.Fatalf("the background command waited on: %+v %q %q", r.Command, r.Stdout, r.Stderr)
	}

	// One with a stdin: written to in two parts, then closed; it reads
	// them all and ends. A write after the close, or to a command started
	// without stdin, is 409 stdin-closed.
	cat := answer("POST", base+"?wait=60s", map[string]any{"cmd": "cat > fed.txt; echo fed", "background": true, "stdin": true}, http.StatusOK)
	if cat.Command == nil || !cat.Command.Running || !cat.Command.Stdin {
		t.Fatalf("a command with a stdin: %+v", cat.Command)
	}
	r = answer("POST", base+"/"+cat.Command.ID+"/stdin?wait=30s", map[string]any{"data": "one\n"}, http.StatusOK)
	if r.Command == nil || !r.Command.Running || !r.Command.Stdin {
		t.Fatalf("after a write: %+v", r.Command)
	}
	r = answer("POST", base+"/"+cat.Command.ID+"/stdin?wait=30s", map[string]any{"data": "two\n", "close": true}, http.StatusOK)
	if r.Command == nil || r.Command.Stdin {
		t.Fatalf("after the close: %+v", r.Command)
	}
	r = answer("GET", base+"/"+cat.Command.ID+"?wait=30s", nil, http.StatusOK)
	if r.Command == nil || r.Command.Running || r.Stdout != "fed\n" {
		t.Fatalf("the command after its stdin closed: %+v %q", r.Command, r.Stdout)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(open('fed.txt').read(), end='')"), "one\ntwo")
	for _, id := range []string{cat.Command.ID, bg.Command.ID} {
		if code, raw := a.do("k-a", "POST", base+"/"+id+"/stdin?wait=30s", map[string]any{"data": "late"}); code != http.StatusConflict ||
			!strings.Contains(string(raw), string(job.ProblemStdinClosed)) {
			t.Errorf("a write to command %s's closed stdin: %d %s; want 409 stdin-closed", id, code, raw)
		}
	}
	// The list: every background command of the interpreter, oldest first,
	// with its command line and where it stands.
	r = answer("GET", base+"?wait=30s", nil, http.StatusOK)
	var listed []string
	for _, c := range r.Commands {
		listed = append(listed, c.ID+" "+c.Cmd)
		if c.Running || c.Stdin || c.ExitCode == nil {
			t.Errorf("listed command %s still running or holding a stdin: %+v", c.ID, c)
		}
	}
	if want := []string{"", "", cat.Command.ID + " cat > fed.txt; echo fed"}; len(listed) != 3 || listed[2] != want[2] ||
		!strings.HasSuffix(listed[0], " echo up; exec sleep 300") {
		t.Fatalf("the list: %q", listed)
	}

	// Refusals: an unknown id, an empty command, another tenant.
	for _, path := range []string{base + "/999", base + "/nope", base + "/999/kill", base + "/999/stdin?wait=30s"} {
		method := "GET"
		if strings.HasSuffix(path, "/kill") {
			method = "POST"
		}
		var body any
		if strings.Contains(path, "/stdin") {
			method, body = "POST", map[string]any{"data": "x"}
		}
		if code, raw := a.do("k-a", method, path, body); code != http.StatusNotFound || !strings.Contains(string(raw), `"field":"cid"`) {
			t.Errorf("%s %s: %d %s; want 404 naming cid", method, path, code, raw)
		}
	}
	if code, raw := a.do("k-a", "POST", base, map[string]any{"cmd": ""}); code != http.StatusUnprocessableEntity || !strings.Contains(string(raw), `"field":"cmd"`) {
		t.Errorf("an empty cmd: %d %s", code, raw)
	}
	if code, raw := a.do("k-a", "POST", base, map[string]any{"cmd": "ls", "timeout_s": 5, "background": true}); code != http.StatusUnprocessableEntity {
		t.Errorf("a background command with a timeout: %d %s", code, raw)
	}
	if code, raw := a.do("k-a", "POST", base, map[string]any{"cmd": "cat", "stdin": true}); code != http.StatusUnprocessableEntity || !strings.Contains(string(raw), `"field":"stdin"`) {
		t.Errorf("a foreground command with a stdin: %d %s", code, raw)
	}
	if code, raw := a.do("k-a", "POST", base+"/"+cat.Command.ID+"/stdin", map[string]any{}); code != http.StatusUnprocessableEntity || !strings.Contains(string(raw), `"field":"data"`) {
		t.Errorf("a stdin write with nothing to do: %d %s", code, raw)
	}
	if code, raw := a.do("k-b", "POST", base+"?wait=10s", map[string]any{"cmd": "ls"}); code != http.StatusNotFound {
		t.Errorf("another tenant's command: %d %s", code, raw)
	}
	wantOut(t, a.exec("k-a", s.ID, "print(x + 1)"), "42")

	// The Go client's commands.
	ctx := t.Context()
	c, err := client.New(a.base, client.WithAPIKey("k-a"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := c.OpenSession(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := cs.Command(ctx, job.CommandRequest{Cmd: "echo from go; ls", Env: map[string]string{"A": "1"}}); err != nil ||
		!strings.HasPrefix(r.Stdout, "from go\n") || !strings.Contains(r.Stdout, "made.txt") || r.Command == nil || r.Command.Running {
		t.Fatalf("client Command: %+v %v", r, err)
	}
	r, err = cs.Command(ctx, job.CommandRequest{Cmd: "sleep 1; echo later", Background: true})
	if err != nil || r.Command == nil || !r.Command.Running {
		t.Fatalf("client background Command: %+v %v", r.Command, err)
	}
	if r, err := cs.WaitCommand(ctx, r.Command.ID, 30*time.Second); err != nil || r.Command == nil || r.Command.Running || r.Stdout != "later\n" {
		t.Fatalf("client WaitCommand: %+v %q %v", r.Command, r.Stdout, err)
	}
	if _, err := cs.KillCommand(ctx, "998"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("client KillCommand of an unknown id: %v", err)
	}
	r, err = cs.Command(ctx, job.CommandRequest{Cmd: "tr a-z A-Z", Background: true, Stdin: true})
	if err != nil || r.Command == nil || !r.Command.Stdin {
		t.Fatalf("client Command with a stdin: %+v %v", r.Command, err)
	}
	if _, err := cs.WriteStdin(ctx, r.Command.ID, "shout\n", true); err != nil {
		t.Fatalf("client WriteStdin: %v", err)
	}
	if _, err := cs.WriteStdin(ctx, r.Command.ID, "more", false); !errors.Is(err, client.ErrStdinClosed) {
		t.Fatalf("client WriteStdin after the close: %v", err)
	}
	if w, err := cs.WaitCommand(ctx, r.Command.ID, 30*time.Second); err != nil || w.Stdout != "SHOUT\n" {
		t.Fatalf("the command fed by the client: %q %v", w.Stdout, err)
	}
	l, err := cs.Commands(ctx)
	if err != nil || len(l.Commands) != 5 || l.Commands[4].Cmd != "tr a-z A-Z" {
		t.Fatalf("client Commands: %+v %v", l.Commands, err)
	}
}
