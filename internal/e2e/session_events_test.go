package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// A session call streams as a job does (issue 24's API): its output as the
// call writes it (kept for a stream opened later), redacted, then its
// result; another tenant gets 404.
func TestSessionCallEvents(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-events", 1, withImages(map[string]string{"python": pythonImage(t)}))
	s := a.create("k-a", map[string]any{})
	// Whether the stream opens while the call runs or after it ended, it
	// carries the call's output events, then its result.
	code := `print("first", flush=True)
print("AKIAIOSFODNN7EXAMPLE", flush=True)
print("second")`
	st, body := a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"code": code})
	if st != http.StatusAccepted {
		t.Fatalf("exec without wait: %d %s", st, body)
	}
	var acc job.CallResult
	if err := json.Unmarshal(body, &acc); err != nil || acc.Seq != 1 {
		t.Fatalf("accepted: %s", body)
	}
	if code, out := a.do("k-b", "GET", "/v1/sessions/"+s.ID+"/calls/1/events", nil); code != http.StatusNotFound {
		t.Fatalf("another tenant's stream: %d %s", code, out)
	}
	req, _ := http.NewRequest("GET", a.base+"/v1/sessions/"+s.ID+"/calls/1/events", nil)
	req.Header.Set("Authorization", "Bearer k-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var stdout strings.Builder
	var result job.CallResult
	var typ string
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
		case strings.HasPrefix(line, "data: ") && typ == job.EventResult:
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &result); err != nil {
				t.Fatalf("result event: %v", err)
			}
		}
	}
	if result.Seq != 1 || result.Status != job.StatusSucceeded {
		t.Fatalf("the stream's result: %+v (stdout events %q)", result, stdout.String())
	}
	if got := stdout.String(); !strings.Contains(got, "first") || !strings.Contains(got, "second") || strings.Contains(got, "AKIAIOSFODNN7EXAMPLE") {
		t.Fatalf("stdout events %q: want both lines, the key redacted", got)
	}
	if strings.Contains(result.Stdout, "AKIAIOSFODNN7EXAMPLE") || result.Redactions == nil {
		t.Fatalf("the call's result is not redacted: %q %v", result.Stdout, result.Redactions)
	}
}
