package box

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
)

// The box source's decisions (box_source.go) without containerd: boxes
// made by a fake maker (box_maker_test.go), on a manual clock. The suites
// in box_test.go and box_isolation_test.go run the same source on real
// containerd.

// Mirror of the box suites' tenant checks at the box source: a tenant's
// idle box serves that tenant's jobs of its class and no one else's, and a
// job no box of its own tenant can take is a miss (here no neutral box is
// ready), never another tenant's box.
func TestBoxOfATenantServesNoOtherTenant(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{})
	bx := s.bx
	acme := &fakeBox{id: "box-acme", tenant: "acme", prepared: s.clock.Now()}
	bx.idle[key("acme", fakeClass)] = []*fakeBox{acme}
	ctx := t.Context()
	if sb := bx.Take(ctx, key("globex", fakeClass), fakeImage); sb != nil {
		t.Fatalf("globex's job took %s's box %s", sb.tenant, sb.id)
	}
	if sb := bx.Take(ctx, key("acme", fakeBigClass), fakeImage); sb != nil {
		t.Fatalf("a job of another class took box %s", sb.id)
	}
	if sb := bx.Take(ctx, key("acme", fakeClass), fakeImage); sb != acme {
		t.Fatalf("acme's job took %v; want its own idle box", sb)
	}
	if bx.hits != 1 || bx.misses != 2 || bx.claims != 0 {
		t.Fatalf("hits %d, misses %d, claims %d; want 1, 2, 0", bx.hits, bx.misses, bx.claims)
	}
}

// Each class keeps Neutral boxes ready or being made, however often it is
// asked to grow; a claimed neutral box is replaced; a class's neutral boxes
// do not stand for another class's.
func TestBoxSourceKeepsTheNeutralTarget(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{Neutral: 2})
	ctx := t.Context()
	for range 3 {
		s.bx.Grow(ctx, fakeClass, fakeImage)
	}
	s.settle(t)
	if made, _ := s.maker.counts(); made != 2 {
		t.Fatalf("made %d boxes for a neutral target of 2", made)
	}
	if st := s.bx.Stats(); st.Neutral != 2 || st.Live != 2 {
		t.Fatalf("stats %+v; want 2 neutral, 2 live", st)
	}
	if sb := s.bx.Take(ctx, key("acme", fakeClass), fakeImage); sb == nil {
		t.Fatal("no neutral box for acme's first job")
	}
	s.settle(t)
	if st := s.bx.Stats(); st.Neutral != 2 || st.Live != 3 || st.Claims != 1 {
		t.Fatalf("after a claim: %+v; want the neutral box replaced (2 neutral, 3 live, 1 claim)", st)
	}
	s.bx.Grow(ctx, fakeBigClass, fakeImage)
	s.settle(t)
	if made, _ := s.maker.counts(); made != 4 {
		t.Fatalf("made %d boxes; want 4 (another class grows on its own)", made)
	}
}

// A neutral box becomes the tenant's at its first job: it comes back to
// that tenant, and the next tenant gets another box.
func TestBoxSourceNeutralBecomesTheTenants(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{})
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	first := s.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	if first == nil || first.tenant != "acme" {
		t.Fatalf("acme's first job took %+v; want a neutral box made acme's", first)
	}
	s.settle(t) // the class's next neutral box
	if !s.bx.Put(key("acme", fakeClass), first) {
		t.Fatal("put refused a box before stop")
	}
	other := s.bx.Take(ctx, key("globex", fakeClass), fakeImage)
	if other == nil || other == first || other.tenant != "globex" {
		t.Fatalf("globex took %+v; want the other neutral box, made globex's", other)
	}
	if again := s.bx.Take(ctx, key("acme", fakeClass), fakeImage); again != first {
		t.Fatalf("acme's second job took %+v; want its own box %s", again, first.id)
	}
	if st := s.bx.Stats(); st.Claims != 2 || st.Hits != 1 || st.Misses != 0 {
		t.Fatalf("stats %+v; want 2 claims, 1 hit", st)
	}
}

// At Max, the least recently used idle box of any tenant is retired to make
// room for a new one; when every box is busy, none is made.
func TestBoxSourceMaxRetiresTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{Max: 2})
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	acme := s.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	s.settle(t)
	globex := s.bx.Take(ctx, key("globex", fakeClass), fakeImage)
	s.settle(t)
	if acme == nil || globex == nil {
		t.Fatalf("acme took %v, globex %v; want a box each", acme, globex)
	}
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	if made, ended := s.maker.counts(); made != 2 || ended != 0 {
		t.Fatalf("with both boxes busy at Max: made %d, ended %d; want 2, 0", made, ended)
	}

	acme.lastUsed = s.clock.Now()
	s.bx.Put(key("acme", fakeClass), acme)
	s.clock.Advance(time.Second)
	globex.lastUsed = s.clock.Now()
	s.bx.Put(key("globex", fakeClass), globex)
	if sb := s.bx.Take(ctx, key("initech", fakeClass), fakeImage); sb != nil {
		t.Fatalf("initech took %s's box", sb.tenant)
	}
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	if got := s.maker.endedIDs(); !slices.Equal(got, []string{acme.id}) {
		t.Fatalf("ended %v; want acme's box %s, the least recently used", got, acme.id)
	}
	if st := s.bx.Stats(); st.Live != 2 || st.Idle != 1 || st.Neutral != 1 || st.Retired != 1 {
		t.Fatalf("stats %+v; want 2 live: globex's idle box and a new neutral one", st)
	}
	if sb := s.bx.Take(ctx, key("globex", fakeClass), fakeImage); sb != globex {
		t.Fatalf("globex took %v; want its own box, kept", sb)
	}
}

// A box older than MaxAge, or whose task ended, is retired when a job
// would take it, idle or neutral; one exactly MaxAge old still serves.
func TestBoxSourceRetiresAtTake(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{MaxAge: 10 * time.Minute})
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	acme := s.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	s.settle(t) // the next neutral box, as old as acme's
	s.bx.Put(key("acme", fakeClass), acme)
	s.clock.Advance(10 * time.Minute)
	if sb := s.bx.Take(ctx, key("acme", fakeClass), fakeImage); sb != acme {
		t.Fatalf("a box exactly MaxAge old: took %v, want %s", sb, acme.id)
	}
	s.bx.Put(key("acme", fakeClass), acme)
	s.clock.Advance(time.Nanosecond)
	if sb := s.bx.Take(ctx, key("acme", fakeClass), fakeImage); sb != nil {
		t.Fatalf("took box %s, older than MaxAge", sb.id)
	}
	if made, ended := s.maker.counts(); made != 2 || ended != 2 {
		t.Fatalf("made %d, ended %d; want both boxes ended (idle and neutral)", made, ended)
	}
	if st := s.bx.Stats(); st.Live != 0 || st.Retired != 2 || st.Misses != 1 {
		t.Fatalf("stats %+v; want none live, 2 retired, 1 miss", st)
	}

	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	exited := make(chan struct{})
	close(exited)
	s.bx.mu.Lock()
	s.bx.neutral[fakeClass][0].exitCh = exited
	s.bx.mu.Unlock()
	if sb := s.bx.Take(ctx, key("acme", fakeClass), fakeImage); sb != nil {
		t.Fatalf("took box %s whose task ended", sb.id)
	}
	if made, ended := s.maker.counts(); made != 3 || ended != 3 {
		t.Fatalf("made %d, ended %d; want the ended box retired", made, ended)
	}
}

// A failed creation is ended and logged, and no box of its class is tried
// again until RetryAfter has passed on the source's clock (another
// class's boxes still are); an awaiting job retries then.
func TestBoxSourceBacksOffAfterAFailure(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{Wait: true})
	parked := make(chan struct{}, 16)
	s.bx.after = func(d time.Duration) <-chan time.Time {
		parked <- struct{}{}
		return s.clock.After(d)
	}
	ctx := t.Context()
	s.maker.failWith(errors.New("image broken"))
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	if made, ended := s.maker.counts(); made != 1 || ended != 1 {
		t.Fatalf("made %d, ended %d; want the failed box ended", made, ended)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "msg=box") || !strings.Contains(logs, "runtime=python") || !strings.Contains(logs, "image broken") {
		t.Fatalf("log %q; want the failure", logs)
	}
	s.maker.failWith(nil)
	s.clock.Advance(RetryAfter - time.Nanosecond)
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.bx.Grow(ctx, fakeBigClass, fakeImage)
	s.settle(t)
	// The class that failed waits; another class's box is still made.
	if made, _ := s.maker.counts(); made != 2 || len(s.bx.neutral[fakeBigClass]) != 1 || len(s.bx.neutral[fakeClass]) != 0 {
		t.Fatalf("made %d boxes within RetryAfter of a failure, neutral %d of the failed class and %d of another; want only the other class's made",
			made, len(s.bx.neutral[fakeClass]), len(s.bx.neutral[fakeBigClass]))
	}

	got := make(chan *fakeBox, 1)
	go func() { got <- s.bx.Await(ctx, key("acme", fakeClass), fakeImage) }()
	testkit.Receive(t, parked, signalWait, "await waiting") // the back-off not over
	if made, _ := s.maker.counts(); made != 2 {
		t.Fatalf("await made a box within RetryAfter of its class's failure")
	}
	s.clock.Advance(RetryAfter) // its retry timer
	sb := testkit.Receive(t, got, signalWait, "await's box")
	if sb == nil || sb.tenant != "acme" {
		t.Fatalf("await gave %+v; want a box made once the back-off ended", sb)
	}
}

// A job waiting for a box wakes when its tenant's box is put back.
func TestBoxSourceAwaitWakesOnPut(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{Wait: true})
	parked := make(chan struct{}, 16)
	s.bx.after = func(d time.Duration) <-chan time.Time {
		parked <- struct{}{}
		return s.clock.After(d) // the manual clock never gets there
	}
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	testkit.Receive(t, s.maker.calls, signalWait, "a box made")
	// The class's next neutral box is held in the making: await has
	// nothing to make and nothing to take until acme's box comes back.
	s.maker.hold()
	busy := s.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	testkit.Receive(t, s.maker.calls, signalWait, "a box made")

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got := make(chan *fakeBox, 1)
	go func() { got <- s.bx.Await(wctx, key("acme", fakeClass), fakeImage) }()
	testkit.Receive(t, parked, signalWait, "await waiting")
	s.bx.Put(key("acme", fakeClass), busy)
	if sb := testkit.Receive(t, got, signalWait, "await's box"); sb != busy {
		t.Fatalf("await gave %v; want the box put back", sb)
	}

	// At the bound, the box put back is taken, not retired to make room
	// for a new one.
	full := newBoxSetup(t, Config{Wait: true, Max: 1})
	full.bx.after = func(d time.Duration) <-chan time.Time {
		parked <- struct{}{}
		return full.clock.After(d)
	}
	full.bx.Grow(ctx, fakeClass, fakeImage)
	full.settle(t)
	only := full.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	go func() { got <- full.bx.Await(wctx, key("acme", fakeClass), fakeImage) }()
	testkit.Receive(t, parked, signalWait, "await waiting at the bound")
	full.bx.Put(key("acme", fakeClass), only)
	if sb := testkit.Receive(t, got, signalWait, "await's box at the bound"); sb != only {
		t.Fatalf("await at the bound gave %v; want the box put back", sb)
	}
	if made, ended := full.maker.counts(); made != 1 || ended != 0 {
		t.Fatalf("at the bound: made %d, ended %d; want the one box, kept", made, ended)
	}
	off := newBoxSetup(t, Config{})
	if sb := off.bx.Await(ctx, key("acme", fakeClass), fakeImage); sb != nil {
		t.Fatalf("await without Config.Wait gave %s", sb.id)
	}
}

// stop retires every idle and neutral box; a box being made is ended once
// made, settle waits for it, and nothing is kept or made afterwards.
func TestBoxSourceStopDrains(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{})
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.bx.Grow(ctx, fakeBigClass, fakeImage)
	s.settle(t)
	testkit.Receive(t, s.maker.calls, signalWait, "a box made")
	testkit.Receive(t, s.maker.calls, signalWait, "a box made")
	s.maker.hold()
	acme := s.bx.Take(ctx, key("acme", fakeClass), fakeImage)
	making := testkit.Receive(t, s.maker.calls, signalWait, "the next neutral box") // held
	s.bx.Put(key("acme", fakeClass), acme)

	s.bx.Stop(ctx)
	if got, want := s.maker.endedIDs(), []string{"box-1", "box-2"}; !slices.Equal(got, want) {
		t.Fatalf("stop ended %v; want the idle and the neutral box %v", got, want)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.bx.Settle(done); err == nil {
		t.Fatal("settle returned while a box was being made")
	}
	if s.bx.Put(key("acme", fakeClass), &fakeBox{id: "late"}) {
		t.Fatal("put kept a box after stop")
	}
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.maker.release()
	s.settle(t)
	if got, want := s.maker.endedIDs(), []string{"box-1", "box-2", making}; !slices.Equal(got, want) {
		t.Fatalf("ended %v; want %v (the box made after stop too)", got, want)
	}
	if made, _ := s.maker.counts(); made != 3 {
		t.Fatalf("made %d boxes; want none after stop", made)
	}
	if st := s.bx.Stats(); st.Live != 0 || st.Idle != 0 || st.Neutral != 0 {
		t.Fatalf("stats after stop %+v; want nothing left", st)
	}
}

// Tenants taking and putting back boxes from many goroutines at once, more
// tenants than boxes: every job gets a box, no box ever serves two
// tenants or two jobs at once, and there are never more than Max boxes.
func TestBoxSourceTenantsNeverShareUnderLoad(t *testing.T) {
	t.Parallel()
	const maxBoxes, jobs = 3, 40
	s := newBoxSetup(t, Config{Max: maxBoxes, Wait: true})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	servedBy := map[*fakeBox]string{}
	busy := map[*fakeBox]bool{}
	var wg sync.WaitGroup
	for g := range 8 {
		tenant := fmt.Sprintf("tenant-%d", g%4)
		wg.Go(func() {
			k := key(tenant, fakeClass)
			for range jobs {
				sb := s.bx.Take(ctx, k, fakeImage)
				if sb == nil {
					sb = s.bx.Await(ctx, k, fakeImage)
				}
				if sb == nil {
					t.Errorf("%s found no box", tenant)
					return
				}
				mu.Lock()
				if prev, ok := servedBy[sb]; ok && prev != tenant || sb.tenant != tenant || busy[sb] {
					t.Errorf("box %s (of %q, served %q, busy %v) given to %s", sb.id, sb.tenant, prev, busy[sb], tenant)
				}
				servedBy[sb], busy[sb] = tenant, true
				mu.Unlock()
				s.clock.Advance(time.Millisecond)
				sb.lastUsed = s.clock.Now()
				mu.Lock()
				busy[sb] = false
				mu.Unlock()
				if !s.bx.Put(k, sb) {
					t.Errorf("put refused %s before stop", sb.id)
				}
			}
		})
	}
	wg.Wait()
	st := s.bx.Stats()
	if st.Hits+st.Claims != 8*jobs {
		t.Errorf("hits %d + claims %d; want %d jobs served", st.Hits, st.Claims, 8*jobs)
	}
	if st.Retired == 0 {
		t.Errorf("no box retired with 4 tenants and Max %d: %+v", maxBoxes, st)
	}
	s.bx.Stop(t.Context())
	s.settle(t)
	s.maker.mu.Lock()
	defer s.maker.mu.Unlock()
	if s.maker.peak > maxBoxes {
		t.Errorf("%d boxes alive at once; Max is %d", s.maker.peak, maxBoxes)
	}
	if len(s.maker.made) != len(s.maker.ended) {
		t.Errorf("made %d boxes, ended %d after stop", len(s.maker.made), len(s.maker.ended))
	}
}

// At the bound, a job of a class no box is of makes room by retiring a
// neutral box of another class (none wants it yet), the oldest; topping a
// class's neutral boxes up (Grow) never does.
func TestBoxSourceDemandRetiresAnotherClassesNeutral(t *testing.T) {
	t.Parallel()
	s := newBoxSetup(t, Config{Max: 1})
	ctx := t.Context()
	s.bx.Grow(ctx, fakeClass, fakeImage)
	s.settle(t)
	s.bx.Grow(ctx, fakeBigClass, fakeImage)
	s.settle(t)
	if made, ended := s.maker.counts(); made != 1 || ended != 0 {
		t.Fatalf("Grow of another class at Max: made %d, ended %d; want 1, 0", made, ended)
	}
	if sb := s.bx.Take(ctx, key("acme", fakeBigClass), fakeImage); sb != nil {
		t.Fatalf("acme took a box of the other class: %v", sb)
	}
	s.bx.Demand(ctx, fakeBigClass, fakeImage)
	s.settle(t)
	if made, ended := s.maker.counts(); made != 2 || ended != 1 {
		t.Fatalf("Demand at Max: made %d, ended %d; want the other class's neutral box retired and one made", made, ended)
	}
	if sb := s.bx.Take(ctx, key("acme", fakeBigClass), fakeImage); sb == nil {
		t.Fatal("no box of the demanded class")
	}
	// Busy: nothing to retire, nothing made.
	s.bx.Demand(ctx, fakeClass, fakeImage)
	s.settle(t)
	if made, ended := s.maker.counts(); made != 2 || ended != 1 {
		t.Fatalf("Demand with the only box busy: made %d, ended %d; want 2, 1", made, ended)
	}
}
