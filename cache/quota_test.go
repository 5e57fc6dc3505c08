package cache

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestAdmitSubmissionRateRefills(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	rate := Rate{PerSecond: 20, Burst: 3}
	for i := range 3 {
		if a, err := s.AdmitSubmission(ctx, "alice", rate, 0, time.Now()); err != nil || a.Quota != "" {
			t.Fatalf("submission %d: %+v %v", i, a, err)
		}
	}
	a, err := s.AdmitSubmission(ctx, "alice", rate, 0, time.Now())
	if err != nil || a.Quota != job.QuotaRate || a.RetryAfter <= 0 || a.RetryAfter > 50*time.Millisecond {
		t.Fatalf("over the burst: %+v %v; want the rate quota, retry within one token (50ms)", a, err)
	}
	if a, _ := s.AdmitSubmission(ctx, "bob", rate, 0, time.Now()); a.Quota != "" {
		t.Fatal("bob's bucket is not alice's")
	}
	ageRateBucket(t, s, "alice", a.RetryAfter+10*time.Millisecond)
	if a, err := s.AdmitSubmission(ctx, "alice", rate, 0, time.Now()); err != nil || a.Quota != "" {
		t.Fatalf("after Retry-After: %+v %v", a, err)
	}
}

func TestAdmitSubmissionCPUDay(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	now := time.Date(2026, 11, 23, 22, 0, 0, 0, time.UTC)
	if err := s.SettleCPU(ctx, "alice", "job-x", 900*time.Millisecond, now); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.AdmitSubmission(ctx, "alice", Rate{}, time.Second, now); a.Quota != "" {
		t.Fatalf("under the quota: %+v", a)
	}
	if err := s.SettleCPU(ctx, "alice", "job-x", 200*time.Millisecond, now); err != nil {
		t.Fatal(err)
	}
	a, err := s.AdmitSubmission(ctx, "alice", Rate{}, time.Second, now)
	if err != nil || a.Quota != job.QuotaCPUDay || a.RetryAfter != 2*time.Hour {
		t.Fatalf("over the quota at 22:00 UTC: %+v %v; want retry in 2h", a, err)
	}
	// The next UTC day starts from zero.
	if a, _ := s.AdmitSubmission(ctx, "alice", Rate{}, time.Second, now.Add(3*time.Hour)); a.Quota != "" {
		t.Fatalf("next day: %+v", a)
	}
}
