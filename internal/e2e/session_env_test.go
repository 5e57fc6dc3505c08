package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A session's env reaches every call and every command under their own;
// it is never shown back, and the audit log keeps its hashes; the env
// rules hold it at creation (a reserved name is 422) and once merged with
// a call's.
func TestSessionEnv(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-env", 1, withImages(map[string]string{"python": pythonImage(t)}))
	start := time.Now().Add(-time.Second)

	for _, env := range []map[string]string{{"PATH": "/evil"}, {"PYTHONUNBUFFERED": "0"}, {"KILN_X": "1"}} {
		code, body := a.do("k-a", "POST", "/v1/sessions", map[string]any{"env": env})
		if code != http.StatusUnprocessableEntity || !strings.Contains(string(body), `"field":"env"`) {
			t.Errorf("env %v: %d %s; want 422 on field env", env, code, body)
		}
	}

	s := a.create("k-a", map[string]any{"env": map[string]string{"GREETING": "from the session", "LEVEL": "session"}})
	if _, body := a.do("k-a", "GET", "/v1/sessions/"+s.ID, nil); strings.Contains(string(body), "from the session") {
		t.Errorf("GET shows the session's env: %s", body)
	}
	wantOut(t, a.exec("k-a", s.ID, "import os\nprint(os.environ['GREETING'], os.environ['LEVEL'])"), "from the session session")

	code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec?wait=60s", map[string]any{"code": "import os\nprint(os.environ['GREETING'], os.environ['LEVEL'])", "env": map[string]string{"LEVEL": "call"}})
	var r job.CallResult
	if code != http.StatusOK || json.Unmarshal(body, &r) != nil {
		t.Fatalf("a call with its own env: %d %s", code, body)
	}
	wantOut(t, r, "from the session call")

	if code, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": "1", "env": map[string]string{"PYTHONHASHSEED": "1"}}); code != http.StatusUnprocessableEntity {
		t.Errorf("a call setting the runtime's reserved env: %d %s; want 422", code, body)
	}
	code, body = a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/commands?wait=60s", map[string]any{"cmd": "echo \"$GREETING\" \"$LEVEL\"", "env": map[string]string{"LEVEL": "command"}})
	if code != http.StatusOK || json.Unmarshal(body, &r) != nil || strings.TrimSpace(r.Stdout) != "from the session command" {
		t.Fatalf("a command: %d %s", code, body)
	}

	code, body = a.do("k-a", "GET", "/v1/audit?kind="+string(job.AuditSessionCreated)+"&since="+url.QueryEscape(start.Format(time.RFC3339Nano)), nil)
	var out struct {
		Records []job.AuditRecord `json:"records"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &out) != nil {
		t.Fatalf("audit: %d %s", code, body)
	}
	// The whole env's hash, as a job's (its sorted NAME=VALUE lines).
	sum := sha256.Sum256([]byte("GREETING=from the session\x00LEVEL=session"))
	found := false
	for _, rec := range out.Records {
		if rec.SessionID == s.ID {
			found = true
			if rec.Inputs["env"] != hex.EncodeToString(sum[:]) {
				t.Errorf("session_created inputs %v: want env %s", rec.Inputs, hex.EncodeToString(sum[:]))
			}
		}
	}
	if strings.Contains(string(body), "from the session") {
		t.Errorf("the audit log holds the env's value: %s", body)
	}
	if !found {
		t.Errorf("no session_created record of %s: %s", s.ID, body)
	}
}
