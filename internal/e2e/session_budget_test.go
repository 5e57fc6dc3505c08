package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Issue 26, acceptance 2 with session calls: a budget of 3 runs takes a job
// and two session calls; the fourth submission, as a session call or as a
// job, is budget-exhausted and not queued; the runs are settled as used; a
// call with the same Idempotency-Key is not charged twice.
func TestBudgetCoversSessionCalls(t *testing.T) {
	e := setup(t)
	a := e.sessionsAPI(t)
	e.startWorker(t, "e2e-session-budget", 1, withImages(map[string]string{"python": pythonImage(t)}))

	code, body := a.do("k-a", "POST", "/v1/budgets", map[string]any{"max_runs": 3, "expires_s": 600})
	var bud job.Budget
	if code != http.StatusCreated || json.Unmarshal(body, &bud) != nil {
		t.Fatalf("create budget: %d %s", code, body)
	}
	code, body = a.do("k-a", "POST", "/v1/jobs?wait=60s", map[string]any{"code": "print('job')", "cache": false, "budget": bud.ID})
	if code != http.StatusOK || !strings.Contains(string(body), `"succeeded"`) {
		t.Fatalf("job charged to the budget: %d %s", code, body)
	}
	s := a.create("k-a", map[string]any{})
	exec := func(code string, hdr ...string) (int, []byte) {
		t.Helper()
		return a.do("k-a", "POST", "/v1/sessions/"+s.ID+"/exec?wait=60s", map[string]any{"code": code, "budget": bud.ID}, hdr...)
	}
	for i, c := range []string{"x = 41", "print(x + 1)"} {
		st, out := exec(c, "Idempotency-Key", "call-"+c)
		if st != http.StatusOK || !strings.Contains(string(out), `"succeeded"`) {
			t.Fatalf("call %d charged to the budget: %d %s", i+1, st, out)
		}
	}
	// The same call again (same key): answered from its record, not charged.
	if st, out := exec("print(x + 1)", "Idempotency-Key", "call-print(x + 1)"); st != http.StatusOK || !strings.Contains(string(out), `"stdout":"42\n"`) {
		t.Fatalf("the same call again: %d %s", st, out)
	}
	var got job.Budget
	testkit.Eventually(t, 20*time.Second, "the budget's three runs settled", func() bool {
		_, out := a.do("k-a", "GET", "/v1/budgets/"+bud.ID, nil)
		return json.Unmarshal(out, &got) == nil && got.Used.Runs == 3 && got.Reserved.Runs == 0
	})
	st, out := exec("print('fourth')")
	if st != http.StatusConflict || !strings.Contains(string(out), "budget-exhausted") || !strings.Contains(string(out), `"field":"budget"`) {
		t.Fatalf("4th as a session call: %d %s", st, out)
	}
	st, out = a.do("k-a", "POST", "/v1/jobs", map[string]any{"code": "print('fourth job')", "cache": false, "budget": bud.ID})
	if st != http.StatusConflict || !strings.Contains(string(out), "budget-exhausted") {
		t.Fatalf("4th as a job: %d %s", st, out)
	}
	// The refused call was not queued: the session's next call is call 3.
	if r := a.exec("k-a", s.ID, "print(x)"); r.Seq != 3 {
		t.Fatalf("after the refusal, the next call is %d, want 3", r.Seq)
	}
	// Another tenant cannot charge alice's budget.
	sb := a.create("k-b", map[string]any{})
	if st, out := a.do("k-b", "POST", "/v1/sessions/"+sb.ID+"/exec?wait=10s", map[string]any{"code": "print(1)", "budget": bud.ID}); st != http.StatusUnprocessableEntity {
		t.Fatalf("another tenant's call on alice's budget: %d %s", st, out)
	}
}
