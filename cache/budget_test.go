package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A budget's runs reserve their limits; together they never pass it; a
// settled run charges what it used, once; a reservation held again (the
// worker's at run start) is not counted twice; another tenant sees nothing.
func TestBudgetReserveAndSettle(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	now := time.Now()
	b := job.Budget{ID: "bud_" + "0123456789abcdef0123456789abcdef", BudgetLimits: job.BudgetLimits{MaxRuns: 3, MaxCPUMS: 2500},
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateBudget(ctx, "alice", b); err != nil {
		t.Fatal(err)
	}
	lim := job.Limits{CPUMS: 1000, TimeoutMS: 5000}
	later := now.Add(time.Minute)
	for _, id := range []string{"j1", "j2"} {
		if r, err := s.ReserveBudget(ctx, "alice", b.ID, id, lim, later, now); err != nil || !r.OK {
			t.Fatalf("%s: %+v %v", id, r, err)
		}
	}
	// 2000 of 2500 ms reserved: a third 1000 ms run does not fit, a 500 ms one does.
	if r, _ := s.ReserveBudget(ctx, "alice", b.ID, "j3", lim, later, now); r.OK || r.Budget.Reserved.CPUMS != 2000 || r.Budget.Reserved.Runs != 2 {
		t.Fatalf("j3 at 1000 ms: %+v", r)
	}
	// j1 again (its run starting) keeps its reservation.
	if r, _ := s.ReserveBudget(ctx, "alice", b.ID, "j1", lim, later, now); !r.OK || r.Budget.Reserved.Runs != 1 {
		t.Fatalf("j1 again: %+v", r)
	}
	if ok, err := s.SettleBudget(ctx, "alice", b.ID, "j1", true, job.BudgetUse{CPUMS: 300, WallMS: 400, ArtifactBytes: 10}); err != nil || !ok {
		t.Fatalf("settle j1: %v %v", ok, err)
	}
	if ok, _ := s.SettleBudget(ctx, "alice", b.ID, "j1", true, job.BudgetUse{CPUMS: 300}); ok {
		t.Fatal("j1 settled twice")
	}
	got, err := s.GetBudget(ctx, "alice", b.ID, now)
	if err != nil {
		t.Fatal(err)
	}
	if got.Used != (job.BudgetUse{Runs: 1, CPUMS: 300, WallMS: 400, ArtifactBytes: 10}) || got.Reserved != (job.BudgetUse{Runs: 1, CPUMS: 1000, WallMS: 5000}) {
		t.Fatalf("budget %+v", got)
	}
	// 300 used + 1000 held: 1000 more fits (2300), and then the third run is the last.
	if r, _ := s.ReserveBudget(ctx, "alice", b.ID, "j3", lim, later, now); !r.OK {
		t.Fatalf("j3 after settling j1: %+v", r)
	}
	if r, _ := s.ReserveBudget(ctx, "alice", b.ID, "j4", job.Limits{CPUMS: 1}, later, now); r.OK {
		t.Fatalf("a fourth run of a 3-run budget: %+v", r)
	}
	// A reservation past its deadline counts no more.
	if r, _ := s.ReserveBudget(ctx, "alice", b.ID, "j4", job.Limits{CPUMS: 1}, later, later.Add(time.Second)); !r.OK {
		t.Fatalf("after the others lapsed: %+v", r)
	}
	if _, err := s.GetBudget(ctx, "bob", b.ID, now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob reads alice's budget: %v", err)
	}
	if _, err := s.ReserveBudget(ctx, "bob", b.ID, "j9", lim, later, now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob reserves alice's budget: %v", err)
	}
}
