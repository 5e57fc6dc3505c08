package sandbox

import (
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/opencontainers/go-digest"

	"github.com/kilnrun/kiln/internal/testkit"
)

// The pool's decisions (targets, expiry, the memory budget, which sandbox
// a job takes) without containerd: a pool whose sandboxes are fakes, on a
// manual clock. The suites in pool_test.go and restart_test.go run the
// same pool on real containerd.

// fakePool is a pool over a fakePoolBackend, on a manual clock, whose
// Retired signals are recorded.
type fakePool struct {
	*pool
	clock   *testkit.Clock
	backend *fakePoolBackend

	mu      sync.Mutex
	retired []PoolEvent
}

func newFakePool(t *testing.T, cfg PoolConfig) *fakePool {
	t.Helper()
	f := &fakePool{clock: testkit.NewClock(time.Time{})}
	f.backend = &fakePoolBackend{clock: f.clock, images: map[string]*imageEntry{"python": fakeImage},
		calls: make(chan string, 1024)}
	cfg.Now = f.clock.Now
	cfg.Hooks.Retired = func(e PoolEvent) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.retired = append(f.retired, e)
	}
	f.pool = newPool(f.backend, cfg, slog.New(slog.NewTextHandler(&f.backend.logs, nil)))
	return f
}

// removedIDs is what the pool removed so far, sorted.
func (f *fakePool) removedIDs() []string { return f.backend.retiredIDs() }

var (
	fakeImage    = &imageEntry{digest: digest.FromString("image v1"), isolation: IsolationRunc}
	fakeRebuilt  = &imageEntry{digest: digest.FromString("image v2"), isolation: IsolationRunc}
	fakeClass    = poolClass{runtime: "python", diskMB: 64}
	fakeBigClass = poolClass{runtime: "python", diskMB: 512}
)

// idle puts a fake sandbox of img, prepared now, in cls's idle list.
func (f *fakePool) idle(cls poolClass, id string, img *imageEntry) *sandbox {
	sb := &sandbox{id: id, img: img, class: cls, prepared: f.clock.Now()}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.classes[cls]
	if st == nil {
		st = &classState{}
		f.classes[cls] = st
	}
	st.idle = append(st.idle, sb)
	return sb
}

func (f *fakePool) target(cls poolClass) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.classes[cls]; st != nil {
		return st.target
	}
	return -1 // the class is gone
}

// A miss raises its class's target by one, up to Max; a minute without a
// miss lowers it by one; a class with no target and no sandbox left is
// dropped, while a runtime's default class never goes below Min.
func TestPoolTargetFollowsMisses(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 2, Min: 1})
	f.classes[fakeBigClass] = &classState{target: 1, def: true}
	ctx := t.Context()
	for range 3 {
		if sb := f.take(ctx, "python", fakeImage, fakeClass); sb != nil {
			t.Fatalf("an empty pool gave sandbox %s", sb.id)
		}
	}
	if got := f.target(fakeClass); got != 2 {
		t.Fatalf("target after 3 misses: %d, want Max (2)", got)
	}
	if cls, ok := f.due(); !ok || cls != fakeClass {
		t.Fatalf("due = %+v %v; want the missed class", cls, ok)
	}
	f.clock.Advance(59 * time.Second)
	f.expire(nil)
	if got := f.target(fakeClass); got != 2 {
		t.Fatalf("target 59 s after the last miss: %d, want 2", got)
	}
	f.clock.Advance(2 * time.Second)
	f.expire(nil)
	if got := f.target(fakeClass); got != 1 {
		t.Fatalf("target a minute after the last miss: %d, want 1", got)
	}
	f.clock.Advance(61 * time.Second)
	f.expire(nil)
	if got := f.target(fakeClass); got != -1 {
		t.Fatalf("a class without target or sandboxes was kept (target %d)", got)
	}
	f.clock.Advance(time.Hour)
	f.expire(nil)
	if got := f.target(fakeBigClass); got != 1 {
		t.Fatalf("the default class's target after an hour without a miss: %d, want Min (1)", got)
	}
	if s := f.Stats(); len(s) != 1 || s[0].Misses != 3 || s[0].Hits != 0 {
		t.Fatalf("stats %+v; want 3 misses", s)
	}
}

// Idle sandboxes leave the pool when they ended, waited longer than
// MaxIdle, are of an image their runtime no longer runs, or are above their
// class's target; the others stay.
func TestPoolExpiresIdleSandboxes(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 4, MaxIdle: 4 * time.Minute})
	f.classes[fakeClass] = &classState{target: 4, lastMiss: f.clock.Now()}
	f.idle(fakeClass, "old", fakeImage)
	f.clock.Advance(3 * time.Minute)
	ended := f.idle(fakeClass, "ended", fakeImage)
	exit := make(chan containerd.ExitStatus)
	close(exit)
	ended.exitCh = exit
	f.idle(fakeClass, "fresh", fakeImage)
	f.idle(fakeClass, "rebuilt", fakeRebuilt)

	f.clock.Advance(59 * time.Second) // old: 3m59s idle
	f.retire(t.Context(), f.expire(map[string]*imageEntry{"python": fakeImage}))
	if got, want := f.removedIDs(), []string{"ended", "rebuilt"}; !slices.Equal(got, want) {
		t.Fatalf("removed %v; want %v (ended, of another image)", got, want)
	}
	f.clock.Advance(2 * time.Second) // old: 4m01s
	f.retire(t.Context(), f.expire(map[string]*imageEntry{"python": fakeImage}))
	if got, want := f.removedIDs(), []string{"ended", "old", "rebuilt"}; !slices.Equal(got, want) {
		t.Fatalf("removed %v; want %v (old outlived MaxIdle)", got, want)
	}
	if len(f.retired) != 3 || f.retired[2].ID != "old" || f.retired[2].Runtime != "python" {
		t.Fatalf("Retired signals %+v; want one per removal, naming the runtime", f.retired)
	}

	// Above target: a lowered target sheds the newest idle sandboxes.
	f.idle(fakeClass, "second", fakeImage)
	f.idle(fakeClass, "third", fakeImage)
	f.classes[fakeClass].target = 1
	f.retire(t.Context(), f.expire(nil))
	if got, want := f.removedIDs(), []string{"ended", "old", "rebuilt", "second", "third"}; !slices.Equal(got, want) {
		t.Fatalf("removed %v; want %v (above the target of 1)", got, want)
	}
	if st := f.classes[fakeClass]; len(st.idle) != 1 || st.idle[0].id != "fresh" {
		t.Fatalf("idle after shedding: %v; want the oldest, fresh", st.idle)
	}
}

// A job takes the oldest idle sandbox of its class that is of its image and
// still running, and the pool removes the ones it passed over; a sandbox of
// another class is never taken.
func TestPoolTakeSkipsStaleSandboxes(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 4})
	f.idle(fakeClass, "before-rebuild", fakeImage)
	f.idle(fakeClass, "current", fakeRebuilt)
	f.idle(fakeClass, "newer", fakeRebuilt)
	f.idle(fakeBigClass, "other-class", fakeRebuilt)
	sb := f.take(t.Context(), "python", fakeRebuilt, fakeClass)
	if sb == nil || sb.id != "current" {
		t.Fatalf("took %v; want current (the oldest of the job's image)", sb)
	}
	if got := f.removedIDs(); !slices.Equal(got, []string{"before-rebuild"}) {
		t.Fatalf("removed %v; want the sandbox of the replaced image", got)
	}
	if s := f.Stats(); len(s) != 1 || s[0].Hits != 1 || s[0].Idle != 2 {
		t.Fatalf("stats %+v; want 1 hit, newer and other-class idle", s)
	}
	// gVisor sandboxes are never pooled.
	gvisor := *fakeRebuilt
	gvisor.isolation = IsolationGVisor
	if sb := f.take(t.Context(), "python", &gvisor, fakeClass); sb != nil {
		t.Fatalf("a gVisor job took pooled sandbox %s", sb.id)
	}
}

// The pool refills the class furthest below its target, and only while
// one sandbox more fits the memory budget its idle sandboxes hold.
func TestPoolRefillKeepsToTheMemoryBudget(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 4, MemoryBudget: 300 << 20})
	f.classes[fakeClass] = &classState{target: 2, memEach: 100 << 20}
	f.classes[fakeBigClass] = &classState{target: 4, memEach: 100 << 20}
	f.idle(fakeBigClass, "big-1", fakeImage)
	if cls, ok := f.due(); !ok || cls != fakeBigClass {
		t.Fatalf("due = %+v %v; want the class 3 below its target", cls, ok)
	}
	f.idle(fakeBigClass, "big-2", fakeImage)
	f.idle(fakeClass, "small-1", fakeImage)
	// 300 MB held: one more would pass the budget.
	if cls, ok := f.due(); ok {
		t.Fatalf("due = %+v with the budget spent; want none", cls)
	}
	f.classes[fakeBigClass].idle = f.classes[fakeBigClass].idle[:1]
	if _, ok := f.due(); !ok {
		t.Fatal("nothing due with 200 MB of a 300 MB budget held and classes below target")
	}
	f.drain()
	if _, ok := f.due(); ok {
		t.Fatal("a drained pool still refills")
	}
}
