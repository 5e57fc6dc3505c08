package cache

import (
	"context"
	"testing"
	"time"
)

// Runs reserve their CPU limit as they start: together they never start
// beyond the quota; a settled run gives back what it did not use, a
// retry's reservation replaces its own, and a lapsed one counts no more.
func TestReserveCPU(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	now := time.Now()
	quota, limit := 3*time.Second, 2*time.Second
	r, err := s.ReserveCPU(ctx, "alice", "job-1", limit, quota, time.Minute, now)
	if err != nil || !r.OK {
		t.Fatalf("first run: %+v %v", r, err)
	}
	// 2 s reserved, 1 s left: a second 2 s run cannot start.
	if r, _ := s.ReserveCPU(ctx, "alice", "job-2", limit, quota, time.Minute, now); r.OK || r.Reserved != limit || r.Used != 0 {
		t.Fatalf("second run while the first holds 2 s: %+v", r)
	}
	// Another tenant's quota is its own.
	if r, _ := s.ReserveCPU(ctx, "bob", "job-9", limit, quota, time.Minute, now); !r.OK {
		t.Fatalf("bob: %+v", r)
	}
	// A retry of job-1 replaces its reservation rather than adding one.
	if r, _ := s.ReserveCPU(ctx, "alice", "job-1", limit, quota, time.Minute, now); !r.OK || r.Reserved != 0 {
		t.Fatalf("retry of job-1: %+v", r)
	}
	// job-1 used 1.5 s: 1.5 s left, not enough for a 2 s run, enough for a 1.5 s one.
	if err := s.SettleCPU(ctx, "alice", "job-1", 1500*time.Millisecond, now); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.ReserveCPU(ctx, "alice", "job-2", limit, quota, time.Minute, now); r.OK || r.Used != 1500*time.Millisecond || r.Reserved != 0 {
		t.Fatalf("after settling 1.5 s: %+v", r)
	}
	if r, _ := s.ReserveCPU(ctx, "alice", "job-3", 1500*time.Millisecond, quota, 50*time.Millisecond, now); !r.OK {
		t.Fatalf("a run that fits exactly: %+v", r)
	}
	if used, _ := s.CPUUsed(ctx, "alice", now); used != 1500*time.Millisecond {
		t.Fatalf("charged %v, want 1.5s", used)
	}
	// job-3's worker dies: its reservation lapses (50 ms) and counts no more.
	ageCPUReservation(t, s, "alice", "job-3", 100*time.Millisecond)
	if r, _ := s.ReserveCPU(ctx, "alice", "job-4", 1500*time.Millisecond, quota, time.Minute, now); !r.OK || r.Reserved != 0 {
		t.Fatalf("after job-3's reservation lapsed: %+v", r)
	}
}
