package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Issue 26's audit log covers sessions: creation, every call accepted (its
// code as a hash) and its result (status, output hashes), and deletion, in
// order, in the session's tenant's log only.
func TestAuditLogOfSessions(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-audit", 1, withImages(map[string]string{"python": pythonImage(t)}))
	start := time.Now().Add(-time.Second)
	read := func(key string) []job.AuditRecord {
		t.Helper()
		code, body := a.do(key, "GET", "/v1/audit?since="+url.QueryEscape(start.Format(time.RFC3339Nano)), nil)
		var out struct {
			Records []job.AuditRecord `json:"records"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &out) != nil {
			t.Fatalf("audit: %d %s", code, body)
		}
		return out.Records
	}
	s := a.create("k-a", map[string]any{})
	wantOut(t, a.exec("k-a", s.ID, "x = 41"), "")
	wantOut(t, a.exec("k-a", s.ID, "print(x + 1)"), "42")
	if code, body := a.do("k-a", "DELETE", "/v1/sessions/"+s.ID, nil); code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, body)
	}
	var got []string
	for _, r := range read("k-a") {
		if r.SessionID != s.ID {
			continue
		}
		got = append(got, fmt.Sprintf("%s %d", r.Kind, r.Call))
		switch r.Kind {
		case job.AuditSessionCall:
			want := map[int64]string{1: "x = 41", 2: "print(x + 1)"}[r.Call]
			if r.CodeSHA256 != job.CodeSHA256(want) || r.Key == "" {
				t.Errorf("call %d's record: %+v", r.Call, r)
			}
		case job.AuditSessionResult:
			if r.Status != job.StatusSucceeded || len(r.Outputs["stdout"]) != 64 {
				t.Errorf("call %d's result record: %+v", r.Call, r)
			}
		case job.AuditSessionCreated:
			if r.Runtime != "python" || r.Digest == "" || r.Key == "" {
				t.Errorf("creation record: %+v", r)
			}
		}
	}
	want := []string{"session_created 0", "session_call 1", "session_result 1", "session_call 2", "session_result 2", "session_ended 0"}
	if !slices.Equal(got, want) {
		t.Fatalf("alice's log of the session:\n%v\nwant\n%v", got, want)
	}
	for _, r := range read("k-b") {
		if r.SessionID == s.ID {
			t.Fatalf("another tenant's log holds the session's record %+v", r)
		}
	}
}
