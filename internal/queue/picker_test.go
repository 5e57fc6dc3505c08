package queue

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A worker's cached listing of the subjects holding jobs stays true
// without asking the stream: a hinted subject is in it at once, a subject
// with nothing to deliver leaves it (empty, or its tenant at its bound); the
// stream is asked again when invalidated or when the listing is maxAge old
// (on the lister's clock), and not otherwise.
func TestCachedListerKeepsItsListingTrue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	for _, tenant := range []string{"alice", "bob", "carol"} {
		if _, err := EnsureTenantConsumer(ctx, js, Config{}, "python", tenant, 1); err != nil {
			t.Fatal(err)
		}
	}
	subj := func(tenant string) string { return job.TenantJobSubject("python", tenant) }
	publish := func(tenant string) {
		t.Helper()
		if _, err := js.Publish(ctx, subj(tenant), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	clock := testkit.NewClock(time.Unix(1_800_000_000, 0))
	l := NewCachedLister(js, time.Minute, clock.Now)
	p := l.NewPicker(Config{}, "python")
	listing := func(want ...string) {
		t.Helper()
		got, err := l.Waiting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var w []string
		for _, tenant := range want {
			w = append(w, subj(tenant))
		}
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Fatalf("listing %v, want %v", got, w)
		}
	}

	publish("alice")
	listing("alice")
	publish("bob")
	listing("alice") // kept: the stream is not asked again
	l.Hint(subj("bob"))
	listing("alice", "bob")

	// alice's one job taken and acked: her next fetch finds nothing, and her
	// subject leaves the listing.
	m, err := p.NextAmong(ctx, mustWaiting(t, l))
	if err != nil || m == nil || m.Subject() != subj("alice") {
		t.Fatalf("first pick: %v %v", m, err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = p.NextAmong(ctx, mustWaiting(t, l))
	if err != nil || m == nil || m.Subject() != subj("bob") {
		t.Fatalf("second pick: %v %v", m, err)
	}
	if m, err := p.NextAmong(ctx, []string{subj("alice")}); err != nil || m != nil {
		t.Fatalf("alice's empty subject: %v %v", m, err)
	}
	listing("bob")

	// bob at his bound (one running, unacked) with a second job queued: his
	// fetch is refused and his subject dropped, until his running job
	// settles and the worker hints it again.
	publish("bob")
	if m, err := p.NextAmong(ctx, []string{subj("bob")}); err != nil || m != nil {
		t.Fatalf("bob at his bound: %v %v", m, err)
	}
	listing()
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	l.Hint(m.Subject())
	listing("bob")

	// carol's job without a hint is seen once the listing is invalidated,
	// or once it is maxAge old.
	publish("carol")
	listing("bob")
	l.Invalidate()
	listing("bob", "carol")
	publish("alice")
	clock.Advance(time.Minute - time.Second)
	listing("bob", "carol")
	clock.Advance(time.Second)
	listing("alice", "bob", "carol")
}

func mustWaiting(t *testing.T, l *Lister) []string {
	t.Helper()
	all, err := l.Waiting(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return all
}
