package cache

import (
	"context"
	"testing"
	"time"
)

// A tenant's audit records are counted per UTC day: what fits its bounds is
// kept, the rest refused, the day's first refusal reported once; another
// tenant and the next day start afresh.
func TestReserveAuditBoundsADay(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	now := time.Date(2026, 11, 23, 23, 0, 0, 0, time.UTC)
	a, err := s.ReserveAudit(ctx, "alice", 3, 300, 5, 0, now)
	if err != nil || a.Kept != 3 || a.First {
		t.Fatalf("within the bound: %+v %v", a, err)
	}
	if a, _ = s.ReserveAudit(ctx, "alice", 4, 400, 5, 0, now); a.Kept != 2 || !a.First || a.Records != 3 {
		t.Fatalf("over the record bound: %+v; want 2 kept, the first refusal", a)
	}
	if a, _ = s.ReserveAudit(ctx, "alice", 1, 100, 5, 0, now); a.Kept != 0 || a.First {
		t.Fatalf("at the bound: %+v; want none kept, not the first refusal", a)
	}
	if a, _ = s.ReserveAudit(ctx, "bob", 1, 100, 5, 0, now); a.Kept != 1 || a.First {
		t.Fatalf("another tenant: %+v", a)
	}
	// Bytes: 250 of 300 left after two records of 100.
	if a, _ = s.ReserveAudit(ctx, "carol", 2, 200, 0, 300, now); a.Kept != 2 {
		t.Fatalf("within the byte bound: %+v", a)
	}
	if a, _ = s.ReserveAudit(ctx, "carol", 2, 200, 0, 300, now); a.Kept != 1 || !a.First || a.Bytes != 200 {
		t.Fatalf("over the byte bound: %+v; want 1 kept", a)
	}
	if a, _ = s.ReserveAudit(ctx, "alice", 1, 100, 5, 0, now.Add(2*time.Hour)); a.Kept != 1 || a.First || a.Records != 0 {
		t.Fatalf("the next UTC day: %+v", a)
	}
	if a, _ = s.ReserveAudit(ctx, "dave", 1000, 1<<20, 0, 0, now); a.Kept != 1000 {
		t.Fatalf("no bounds: %+v", a)
	}
}
