package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

func TestClientBudgetsReplayAndAudit(t *testing.T) {
	t.Parallel()
	e := startEnv(t, map[string]string{"key-1": "tests"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(e.URL, client.WithAPIKey("key-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateBudget(ctx, client.BudgetRequest{BudgetLimits: job.BudgetLimits{MaxRuns: 1}, Expires: time.Hour})
	if err != nil || !job.ValidBudgetID(b.ID) || b.ExpiresAt.Sub(b.CreatedAt) != time.Hour {
		t.Fatalf("CreateBudget: %+v %v", b, err)
	}
	first, err := c.Submit(ctx, job.Spec{Code: "print(1)", Budget: b.ID, Cache: job.CacheOff()})
	if err != nil || !first.Accepted {
		t.Fatalf("first job: %+v %v", first, err)
	}
	if _, err := c.Submit(ctx, job.Spec{Code: "print(2)", Budget: b.ID, Cache: job.CacheOff()}); !errors.Is(err, client.ErrBudgetExhausted) {
		t.Fatalf("second job of a 1-run budget: %v", err)
	}
	if got, err := c.GetBudget(ctx, b.ID); err != nil || got.Reserved.Runs != 1 {
		t.Fatalf("GetBudget: %+v %v", got, err)
	}
	if _, err := c.Replay(ctx, first.ID); !errors.Is(err, client.ErrReplayUnavailable) {
		t.Fatalf("replay of a queued job: %v", err)
	}
	recs, err := c.Audit(ctx, time.Time{}, "", 0)
	if err != nil || len(recs) != 3 || recs[0].Kind != job.AuditBudgetCreated || recs[1].Kind != job.AuditSubmission || recs[2].Kind != job.AuditBudgetRefusal {
		t.Fatalf("Audit: %+v %v", recs, err)
	}
	if recs, err := c.Audit(ctx, time.Time{}, job.AuditSubmission, 10); err != nil || len(recs) != 1 || recs[0].JobID != first.ID {
		t.Fatalf("Audit kind=submission: %+v %v", recs, err)
	}
}
