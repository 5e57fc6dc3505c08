package producer

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func budgetTenants(c *Config) { c.APIKeys = map[string]string{"key-a": "alice", "key-b": "bob"} }

var (
	asAlice = []string{"Authorization", "Bearer key-a"}
	asBob   = []string{"Authorization", "Bearer key-b"}
)

func (b *bundle) createBudget(t *testing.T, body string) job.Budget {
	t.Helper()
	r := b.do(t, http.MethodPost, "/v1/budgets", body, asAlice...)
	if r.StatusCode != http.StatusCreated {
		t.Fatalf("create budget: %d %s", r.StatusCode, r.body)
	}
	var bud job.Budget
	r.decode(t, &bud)
	if !job.ValidBudgetID(bud.ID) || r.Header.Get("Location") != "/v1/budgets/"+bud.ID {
		t.Fatalf("created %s (Location %q)", r.body, r.Header.Get("Location"))
	}
	return bud
}

func (b *bundle) getBudget(t *testing.T, id string) job.Budget {
	t.Helper()
	r := b.do(t, http.MethodGet, "/v1/budgets/"+id, "", asAlice...)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("get budget: %d %s", r.StatusCode, r.body)
	}
	var bud job.Budget
	r.decode(t, &bud)
	return bud
}

// Acceptance 2 of issue 26, first half: a budget of 3 runs takes three
// jobs; the fourth submission, as a job or a batch item, is refused with
// budget-exhausted naming the field; another tenant cannot see or use it.
func TestBudgetOfThreeRunsRefusesTheFourth(t *testing.T) {
	t.Parallel()
	b := setup(t, budgetTenants)
	bud := b.createBudget(t, `{"max_runs": 3, "expires_s": 600}`)
	for i := range 3 {
		accepted(t, b.submit(t, fmt.Sprintf(`{"code": "print(%d)", "cache": false, "budget": %q}`, i, bud.ID), asAlice...))
	}
	p := b.submit(t, fmt.Sprintf(`{"code": "print(4)", "cache": false, "budget": %q}`, bud.ID), asAlice...).problem(t, http.StatusConflict)
	if p.Type != string(job.ProblemBudgetExhausted) || p.Field != "budget" {
		t.Fatalf("4th job: %+v", p)
	}
	r := b.do(t, http.MethodPost, "/v1/jobs/batch", fmt.Sprintf(`{"jobs": [{"code": "print(5)", "cache": false, "budget": %q}]}`, bud.ID), asAlice...)
	var batch struct {
		Jobs []struct {
			Status int         `json:"status"`
			Error  problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &batch)
	if len(batch.Jobs) != 1 || batch.Jobs[0].Status != http.StatusConflict || batch.Jobs[0].Error.Type != string(job.ProblemBudgetExhausted) {
		t.Fatalf("batch item: %d %s", r.StatusCode, r.body)
	}
	got := b.getBudget(t, bud.ID)
	if got.MaxRuns != 3 || got.Reserved.Runs != 3 || got.Used.Runs != 0 || !got.ExpiresAt.After(got.CreatedAt) {
		t.Fatalf("budget %+v", got)
	}
	// Bob sees no such budget, and cannot charge it.
	b.do(t, http.MethodGet, "/v1/budgets/"+bud.ID, "", asBob...).problem(t, http.StatusNotFound)
	p = b.submit(t, fmt.Sprintf(`{"code": "print(6)", "cache": false, "budget": %q}`, bud.ID), asBob...).problem(t, http.StatusUnprocessableEntity)
	if p.Field != "budget" {
		t.Fatalf("bob's job: %+v", p)
	}
}

// Acceptance 2, second half: a budget of 2 s of CPU refuses a job whose
// CPU limit exceeds what is left and accepts one that fits; a job canceled
// while queued gives its share back.
func TestBudgetOfCPURefusesWhatDoesNotFit(t *testing.T) {
	t.Parallel()
	b := setup(t, budgetTenants)
	bud := b.createBudget(t, `{"max_cpu_ms": 2000}`)
	spec := func(cpu int) string {
		return fmt.Sprintf(`{"code": "print(%d)", "cache": false, "budget": %q, "limits": {"cpu_ms": %d}}`, cpu, bud.ID, cpu)
	}
	first := accepted(t, b.submit(t, spec(1500), asAlice...))
	p := b.submit(t, spec(1000), asAlice...).problem(t, http.StatusConflict)
	if p.Type != string(job.ProblemBudgetExhausted) {
		t.Fatalf("1000 ms with 500 left: %+v", p)
	}
	accepted(t, b.submit(t, spec(500), asAlice...))
	if got := b.getBudget(t, bud.ID); got.Reserved.CPUMS != 2000 {
		t.Fatalf("reserved %+v", got.Reserved)
	}
	if r := b.do(t, http.MethodDelete, "/v1/jobs/"+first.ID, "", asAlice...); r.StatusCode != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.StatusCode, r.body)
	}
	if got := b.getBudget(t, bud.ID); got.Reserved.CPUMS != 500 || got.Reserved.Runs != 1 {
		t.Fatalf("after canceling the 1500 ms job: reserved %+v", got.Reserved)
	}
	accepted(t, b.submit(t, spec(1000), asAlice...))
}

func TestBudgetRequestsAreChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, budgetTenants)
	for body, field := range map[string]string{
		`{}`:                                     "max_runs",
		`{"max_runs": -1}`:                       "max_runs",
		`{"max_runs": 1, "expires_s": 99999999}`: "expires_s",
		`{"max_runs": 1, "expires_s": -5}`:       "expires_s",
	} {
		p := b.do(t, http.MethodPost, "/v1/budgets", body, asAlice...).problem(t, http.StatusUnprocessableEntity)
		if p.Field != field {
			t.Errorf("%s: field %q, want %q (%s)", body, p.Field, field, p.Detail)
		}
	}
	b.do(t, http.MethodPost, "/v1/budgets", `{"max_runs": 1, "max_run": 2}`, asAlice...).problem(t, http.StatusBadRequest)
	b.do(t, http.MethodGet, "/v1/budgets/nope", "", asAlice...).problem(t, http.StatusBadRequest)
	p := b.submit(t, `{"code": "print(1)", "budget": "nope"}`, asAlice...).problem(t, http.StatusUnprocessableEntity)
	if p.Field != "budget" {
		t.Fatalf("bad budget id: %+v", p)
	}
}

// A tool call names the harness's budget with ?budget=: one the budget
// cannot cover is the caller's 409, not a tool result for the model.
func TestToolCallNamesABudget(t *testing.T) {
	t.Parallel()
	b := setup(t, budgetTenants)
	bud := b.createBudget(t, `{"max_cpu_ms": 1}`)
	call := `{"type":"tool_use","id":"toolu_01","name":"run_python","input":{"code":"print(1)"}}`
	p := b.do(t, http.MethodPost, "/v1/tool-calls?budget="+bud.ID, call, asAlice...).problem(t, http.StatusConflict)
	if p.Type != string(job.ProblemBudgetExhausted) {
		t.Fatalf("tool call over its budget: %+v", p)
	}
	if got := b.getBudget(t, bud.ID); got.Reserved.Runs != 0 {
		t.Fatalf("a refused call holds %+v", got.Reserved)
	}
}
