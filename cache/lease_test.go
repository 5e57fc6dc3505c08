package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A live lease keeps a duplicate delivery from running the job a second
// time; a lapsed one (its worker died) lets the redelivery take over.
func TestLeaseKeepsDuplicatesOut(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	mustCreate(t, s, msg)

	const lease = 10 * time.Second // long: only ageLease moves it along
	if st, err := s.MarkRunningLeased(ctx, msg.ID, "w1", 1, time.Time{}, Lease{"w1/1", lease}); err != nil || st != job.StatusRunning {
		t.Fatalf("first MarkRunningLeased = %q, %v", st, err)
	}
	// A retried call by the holder is harmless.
	if st, err := s.MarkRunningLeased(ctx, msg.ID, "w1", 1, time.Time{}, Lease{"w1/1", lease}); err != nil || st != job.StatusRunning {
		t.Fatalf("holder's retried MarkRunningLeased = %q, %v", st, err)
	}
	// A duplicate delivery, leased or not, is refused and changes nothing.
	for _, l := range []time.Duration{lease, 0} {
		st, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", l})
		if !errors.Is(err, ErrLeased) || st != job.StatusRunning {
			t.Fatalf("duplicate MarkRunningLeased(lease %v) = %q, %v; want running, ErrLeased", l, st, err)
		}
	}
	if rec := mustGet(t, s, msg.ID); rec.Worker != "w1" || rec.Attempt != 1 {
		t.Fatalf("a refused duplicate changed the record: %+v", rec)
	}
	// Giving up on the job (deliveries ran out) waits for the holder too.
	res := job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "gave up")}
	if won, err := s.Abandon(ctx, msg.ID, res); won || !errors.Is(err, ErrLeased) {
		t.Fatalf("Abandon under a live lease = %v, %v; want ErrLeased", won, err)
	}
	// A cancellation request does not let the duplicate finish the job either:
	// the live holder carries it out.
	if st, err := s.Cancel(ctx, msg.ID); err != nil || st != job.StatusRunning {
		t.Fatalf("Cancel = %q, %v", st, err)
	}
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", lease}); !errors.Is(err, ErrLeased) {
		t.Fatalf("duplicate after cancel request = %v, want ErrLeased", err)
	}

	if left := leaseLeft(t, s, msg.ID); left <= 0 || left > lease {
		t.Fatalf("a %v lease has %v left", lease, left)
	}
	// Renewing keeps the lease past its first term: each renewal, half a
	// term after the last, gives it a whole term again.
	for range 3 {
		ageLease(t, s, msg.ID, lease/2)
		if held, err := s.RenewLease(ctx, msg.ID, Lease{"w1/1", lease}); err != nil || !held {
			t.Fatalf("RenewLease by holder = %v, %v", held, err)
		}
		if left := leaseLeft(t, s, msg.ID); left <= lease/2 || left > lease {
			t.Fatalf("a renewed %v lease has %v left", lease, left)
		}
	}
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", lease}); !errors.Is(err, ErrLeased) {
		t.Fatalf("duplicate after renewals = %v, want ErrLeased", err)
	}
	if held, err := s.RenewLease(ctx, msg.ID, Lease{"w2/2", lease}); err != nil || held {
		t.Fatalf("RenewLease by a non-holder = %v, %v; want false", held, err)
	}

	// The holder stops renewing (it died): the lease lapses and the
	// redelivery takes over; here the pending cancellation wins.
	ageLease(t, s, msg.ID, lease+100*time.Millisecond)
	if st, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", lease}); err != nil || st != job.StatusCanceled {
		t.Fatalf("MarkRunningLeased after the lease lapsed = %q, %v; want canceled", st, err)
	}
	if held, err := s.RenewLease(ctx, msg.ID, Lease{"w1/1", lease}); err != nil || held {
		t.Fatalf("RenewLease on a terminal job = %v, %v; want false", held, err)
	}
}

func TestLeaseLapseHandsJobOver(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	mustCreate(t, s, msg)
	const lease = 10 * time.Second // long: only ageLease moves it along
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w1", 1, time.Time{}, Lease{"w1/1", lease}); err != nil {
		t.Fatal(err)
	}
	ageLease(t, s, msg.ID, lease+100*time.Millisecond)
	if st, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", lease}); err != nil || st != job.StatusRunning {
		t.Fatalf("takeover = %q, %v", st, err)
	}
	if rec := mustGet(t, s, msg.ID); rec.Worker != "w2" || rec.Attempt != 2 {
		t.Fatalf("after takeover %+v", rec)
	}
	// The old holder finds out at its next renewal.
	if held, err := s.RenewLease(ctx, msg.ID, Lease{"w1/1", lease}); err != nil || held {
		t.Fatalf("old holder's RenewLease = %v, %v; want false", held, err)
	}
	// With the new lease live, giving up is refused; once it lapses, it wins.
	res := job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "gave up")}
	if _, err := s.Abandon(ctx, msg.ID, res); !errors.Is(err, ErrLeased) {
		t.Fatalf("Abandon = %v, want ErrLeased", err)
	}
	ageLease(t, s, msg.ID, lease+100*time.Millisecond)
	if won, err := s.Abandon(ctx, msg.ID, res); err != nil || !won {
		t.Fatalf("Abandon after lapse = %v, %v", won, err)
	}
	if held, err := s.RenewLease(ctx, job.NewID(), Lease{"w1/1", lease}); !errors.Is(err, ErrNotFound) || held {
		t.Fatalf("RenewLease(missing) = %v, %v; want ErrNotFound", held, err)
	}
}

// A worker handing a job back releases its lease: the redelivery need not
// wait for it to lapse.
func TestReleaseLease(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	mustCreate(t, s, msg)
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w1", 1, time.Time{}, Lease{"w1/1", time.Hour}); err != nil {
		t.Fatal(err)
	}
	if held, err := s.ReleaseLease(ctx, msg.ID, "w2/2"); err != nil || held {
		t.Fatalf("ReleaseLease by a non-holder = %v, %v", held, err)
	}
	if _, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", time.Hour}); !errors.Is(err, ErrLeased) {
		t.Fatalf("a non-holder released the lease: %v", err)
	}
	if held, err := s.ReleaseLease(ctx, msg.ID, "w1/1"); err != nil || !held {
		t.Fatalf("ReleaseLease by the holder = %v, %v", held, err)
	}
	if st, err := s.MarkRunningLeased(ctx, msg.ID, "w2", 2, time.Time{}, Lease{"w2/2", time.Hour}); err != nil || st != job.StatusRunning {
		t.Fatalf("takeover after release = %q, %v", st, err)
	}
}
