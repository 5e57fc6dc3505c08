package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// Issue 36, acceptance 4: a node session through the live API and a real
// worker keeps globalThis, a required module and a file between calls; its
// files are downloadable; a shell command runs in it; GET /v1/runtimes
// says node has sessions.
func TestNodeSessionKeepsStateThroughTheAPI(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-node-session", 1, withImages(map[string]string{"python": pythonImage(t), "node": recipeImage(t, "node")}))

	s := a.create("k-a", map[string]any{"runtime": "node"})
	if s.Runtime != "node" {
		t.Fatalf("created %+v", s)
	}
	wantOut(t, a.exec("k-a", s.ID, "globalThis.count = 1\nconst fs = require('fs')\nconst path = require('path')\nfs.writeFileSync('state.json', JSON.stringify({ a: 1 }))\nconsole.log('ready')"), "ready")
	r := a.exec("k-a", s.ID, "count += 1\nconsole.log(count, JSON.parse(fs.readFileSync('state.json', 'utf8')).a, path.basename('/x/y.js'))")
	wantOut(t, r, "2 1 y.js")
	if r.Seq != 2 || r.Incarnation != 1 {
		t.Errorf("the second call: seq %d incarnation %d", r.Seq, r.Incarnation)
	}
	// A value is a display output, as a python call's last expression.
	r = a.exec("k-a", s.ID, "({ count, kind: typeof fs })")
	if r.Status != job.StatusSucceeded || len(r.Outputs) != 1 || !strings.Contains(string(r.Outputs[0].Data["text/plain"]), "count: 2") {
		t.Errorf("a call's value: %s %+v", r.Status, r.Outputs)
	}
	// An error is the call's alone.
	r = a.exec("k-a", s.ID, "null.x")
	if r.Status != job.StatusFailed || r.Error == nil || r.Error.Category != job.CategoryRuntimeError || r.Error.Retryable {
		t.Errorf("a throwing call: %s %+v", r.Status, r.Error)
	}
	wantOut(t, a.exec("k-a", s.ID, "console.log(count)"), "2")

	if code, body := a.do("k-a", "GET", "/v1/sessions/"+s.ID+"/files/state.json", nil); code != http.StatusOK || string(body) != `{"a":1}` {
		t.Errorf("GET a file the session wrote: %d %s", code, body)
	}
	code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/commands?wait=60s", map[string]any{"cmd": "ls -la && node --version"})
	var cr job.CallResult
	if code != http.StatusOK || json.Unmarshal(body, &cr) != nil || cr.Status != job.StatusSucceeded ||
		!strings.Contains(cr.Stdout, "state.json") || !strings.Contains(cr.Stdout, "v18") {
		t.Errorf("a command in a node session: %d %s", code, body)
	}
	wantOut(t, a.exec("k-a", s.ID, "console.log(count + 1)"), "3")

	code, body = a.do("k-a", "GET", "/v1/runtimes", nil)
	var rts struct {
		Runtimes []job.RuntimeInfo `json:"runtimes"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &rts) != nil {
		t.Fatalf("GET /v1/runtimes: %d %s", code, body)
	}
	for _, rt := range rts.Runtimes {
		if rt.Sessions == nil || !*rt.Sessions {
			t.Errorf("runtime %s: sessions %v", rt.Name, rt.Sessions)
		}
	}
}

// Issue 36, acceptance 6, for node: a paused node session holds no box and
// resumes on another worker with its files (restored: files, its variables
// gone and the note saying so); one with restore "replay" gets its
// variables back by its calls run again.
func TestNodeSessionPauseAndResume(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	imgs := map[string]string{"python": pythonImage(t), "node": recipeImage(t, "node")}
	stopFirst := e.startWorker(t, "e2e-node-pause-1", 1, withImages(imgs))
	files := a.create("k-a", map[string]any{"runtime": "node"})
	replay := a.create("k-a", map[string]any{"runtime": "node", "restore": "replay"})
	wantOut(t, a.exec("k-a", files.ID, "globalThis.x = 41\nrequire('fs').writeFileSync('data.txt', 'kept')\nconsole.log(x)"), "41")
	wantOut(t, a.exec("k-a", replay.ID, "globalThis.y = 6 * 7\nconsole.log(y)"), "42")

	client, err := containerd.New(e.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(t.Context(), testenv.ContainerdNamespace())
	for _, s := range []job.Session{files, replay} {
		code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/pause?wait=60s", nil)
		var v job.Session
		if code != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Status != job.SessionPaused {
			t.Fatalf("pause %s: %d %s", s.ID, code, body)
		}
		waitNoBox(t, nctx, client, s.ID)
	}
	stopFirst()
	e.startWorker(t, "e2e-node-pause-2", 1, withImages(imgs))
	code, body := a.do("k-a", "POST", "/v1/sessions/"+files.ID+"/resume", nil)
	var v job.Session
	if code != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Status != job.SessionReady || v.Restored != job.RestoredFiles {
		t.Fatalf("resume: %d %s; want ready, restored files", code, body)
	}
	r := a.exec("k-a", files.ID, "console.log(require('fs').readFileSync('data.txt', 'utf8'), typeof x)")
	wantOut(t, r, "kept undefined")
	if r.StateRestored || r.Worker != "e2e-node-pause-2" || !strings.Contains(r.SessionNote, "paused") {
		t.Fatalf("after the resume: state_restored %v worker %q note %q", r.StateRestored, r.Worker, r.SessionNote)
	}
	r = a.exec("k-a", replay.ID, "console.log(y)")
	wantOut(t, r, "42")
	if !r.StateRestored || !strings.Contains(r.SessionNote, "replay") || r.Worker != "e2e-node-pause-2" {
		t.Fatalf("a call to a paused replay session: state_restored %v worker %q note %q", r.StateRestored, r.Worker, r.SessionNote)
	}
}
