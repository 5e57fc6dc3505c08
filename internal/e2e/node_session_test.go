package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

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
