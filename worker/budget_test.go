package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A run charges its budget what it used as its result is recorded; a run
// the budget can no longer cover does not start.
func TestBudgetSettledAtRunEndAndRefusedAtRunStart(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	ctx := context.Background()
	now := time.Now()
	bud := job.Budget{ID: "bud_" + strings.Repeat("ab", 16), BudgetLimits: job.BudgetLimits{MaxRuns: 1},
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := b.store.CreateBudget(ctx, "acme", bud); err != nil {
		t.Fatal(err)
	}
	rt := &testkit.Runtime{Script: func(context.Context, string, job.Spec) (job.Result, error) {
		return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), CPUMS: 120, WallMS: 300,
			Artifacts: []job.Artifact{{Name: "a.txt", Size: 10, SHA256: strings.Repeat("a", 64)}},
			Image:     job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}}, nil
	}}
	b.start(t, rt, nil)
	withBudget := func(m *job.Message) { m.Spec.Budget = bud.ID }
	first := b.submitAs(t, "acme", "print(1)", withBudget)
	if r := b.waitTerminal(t, first, 20*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("first run: %s %+v", r.Status, r.Result.Error)
	}
	got, err := b.store.GetBudget(ctx, "acme", bud.ID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got.Used != (job.BudgetUse{Runs: 1, CPUMS: 120, WallMS: 300, ArtifactBytes: 10}) || got.Reserved != (job.BudgetUse{}) {
		t.Fatalf("after one run: used %+v reserved %+v", got.Used, got.Reserved)
	}
	second := b.submitAs(t, "acme", "print(2)", withBudget)
	r := b.waitTerminal(t, second, 20*time.Second).Result
	if r.Status != job.StatusFailed || r.Error == nil || r.Error.Retryable || !strings.Contains(r.Error.Message, string(job.ProblemBudgetExhausted)) {
		t.Fatalf("second run: %s %+v", r.Status, r.Error)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("the runtime ran %d jobs; the refused one must not start", n)
	}
	if got, _ := b.store.GetBudget(ctx, "acme", bud.ID, time.Now()); got.Used.Runs != 1 {
		t.Fatalf("the refused run was charged: %+v", got.Used)
	}
}
