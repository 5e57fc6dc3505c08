package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// signalWait bounds a test's wait for a signal of the code under test.
const signalWait = 30 * time.Second

// The pool's refills, measures and removals through a fake backend
// (poolBackend): what the pool asks of containerd, without containerd.

// fakePoolBackend serves runtimes whose images it names, prepares fake
// sandboxes at once (or, held, once released) and records what it prepared
// and removed.
type fakePoolBackend struct {
	clock *testkit.Clock
	// calls hears of every prepareIdle call, before it waits on the gate.
	calls chan string
	logs  testkit.SyncBuffer

	mu       sync.Mutex
	images   map[string]*imageEntry // by runtime: what resolve answers
	boxed    map[string]bool        // runtimes whose jobs run in boxes
	mem      int64                  // what each idle sandbox holds
	fail     error                  // what prepareIdle fails with
	gate     chan struct{}
	prepared []*sandbox
	retired  []string
}

func (b *fakePoolBackend) Runtimes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var rts []string
	for rt := range b.images {
		rts = append(rts, rt)
	}
	slices.Sort(rts)
	return rts
}

func (b *fakePoolBackend) resolve(_ context.Context, runtime string) (*imageEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if img := b.images[runtime]; img != nil {
		return img, nil
	}
	return nil, fmt.Errorf("no image for %s", runtime)
}

// defaultClass: fakeClass's disk for every runtime.
func (b *fakePoolBackend) defaultClass(runtime string, _ *imageEntry) (poolClass, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return poolClass{runtime: runtime, diskMB: fakeClass.diskMB}, b.boxed[runtime], nil
}

func (b *fakePoolBackend) creationLimits(_ *imageEntry, cls poolClass) (job.Limits, error) {
	return job.Limits{DiskMB: cls.diskMB}, nil
}

func (b *fakePoolBackend) prepareIdle(_ context.Context, img *imageEntry, cls poolClass, lim job.Limits, _ []string) (*sandbox, error) {
	b.mu.Lock()
	sb := &sandbox{id: fmt.Sprintf("pool-%d", len(b.prepared)+1), img: img, class: cls, prepared: b.clock.Now()}
	b.prepared = append(b.prepared, sb)
	err, gate := b.fail, b.gate
	b.mu.Unlock()
	b.calls <- sb.id
	if gate != nil {
		<-gate
	}
	if lim.DiskMB != cls.diskMB {
		err = errors.Join(err, fmt.Errorf("created with %d MB of disk, class %d", lim.DiskMB, cls.diskMB))
	}
	return sb, err
}

func (b *fakePoolBackend) retire(_ context.Context, sb *sandbox) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sb != nil {
		b.retired = append(b.retired, sb.id)
	}
}

func (b *fakePoolBackend) idleMemory(*sandbox) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mem, nil
}

func (b *fakePoolBackend) set(f func(*fakePoolBackend)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b)
}

// preparedIn counts the sandboxes prepared, by class.
func (b *fakePoolBackend) preparedIn() map[poolClass]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := map[poolClass]int{}
	for _, sb := range b.prepared {
		n[sb.class]++
	}
	return n
}

func (b *fakePoolBackend) retiredIDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := slices.Clone(b.retired)
	slices.Sort(ids)
	return ids
}

// refillAll refills until nothing is due and returns how many it prepared.
func (f *fakePool) refillAll(ctx context.Context) int {
	n := 0
	for f.refillOne(ctx) {
		n++
	}
	return n
}

// The pool seeds each pooled runtime's default class at Min and refills it
// to its target through the backend, one sandbox per job taken; runtimes
// whose jobs run in boxes, or under gVisor, are not seeded.
func TestPoolRefillsToTheTarget(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 3, Min: 2})
	gvisor := *fakeImage
	gvisor.isolation = IsolationGVisor
	f.backend.set(func(b *fakePoolBackend) {
		b.images["boxed"], b.images["sandboxed"] = fakeImage, &gvisor
		b.boxed = map[string]bool{"boxed": true}
	})
	ctx := t.Context()
	f.seed(ctx)
	if n := f.refillAll(ctx); n != 2 {
		t.Fatalf("refilled %d sandboxes; want Min (2)", n)
	}
	if got := f.backend.preparedIn(); len(got) != 1 || got[fakeClass] != 2 {
		t.Fatalf("prepared %v; want 2 of python's default class only", got)
	}
	sb := f.take(ctx, "python", fakeImage, fakeClass)
	if sb == nil {
		t.Fatal("a job found no pooled sandbox after the refill")
	}
	if n := f.refillAll(ctx); n != 1 {
		t.Fatalf("refilled %d after a job took one; want 1", n)
	}
	if s := f.Stats(); len(s) != 1 || s[0].Idle != 2 || s[0].Target != 2 || s[0].Refills != 3 || s[0].Hits != 1 {
		t.Fatalf("stats %+v; want 2 idle of a target of 2, 3 refills, 1 hit", s)
	}
}

// The pool's loop does the same on its own: it fills the default class at
// start and a class a job missed, then stops with its context.
func TestPoolRunRefillsOnAMiss(t *testing.T) {
	t.Parallel()
	refilled := make(chan PoolEvent, 16)
	f := newFakePool(t, PoolConfig{Max: 3, Min: 2, Hooks: PoolHooks{Refilled: func(e PoolEvent) { refilled <- e }}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(ctx)
	}()
	defer func() { cancel(); <-done }()
	testkit.Receive(t, refilled, signalWait, "the first refill")
	testkit.Receive(t, refilled, signalWait, "the second refill")
	if sb := f.take(ctx, "python", fakeImage, fakeBigClass); sb != nil {
		t.Fatalf("a job of a class never missed took %s", sb.id)
	}
	if e := testkit.Receive(t, refilled, signalWait, "the missed class's refill"); e.Runtime != "python" {
		t.Fatalf("refilled %+v; want python's", e)
	}
	cancel()
	testkit.Closed(t, done, signalWait, "the pool's loop to stop")
	if got := f.backend.preparedIn(); got[fakeClass] != 2 || got[fakeBigClass] != 1 {
		t.Fatalf("prepared %v; want 2 of the default class and 1 of the missed class", got)
	}
}

// Refills stop once one sandbox more would pass the memory budget, as the
// backend measures the idle sandboxes.
func TestPoolMeasuredMemoryStopsRefills(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 4, Min: 4, MemoryBudget: 250 << 20})
	f.backend.set(func(b *fakePoolBackend) { b.mem = 100 << 20 })
	ctx := t.Context()
	f.seed(ctx)
	n := 0
	for f.refillOne(ctx) {
		n++
		f.measure()
	}
	if n != 2 {
		t.Fatalf("refilled %d sandboxes of 100 MB within a budget of 250 MB; want 2", n)
	}
	if s := f.Stats(); len(s) != 1 || s[0].MemoryBytes != 200<<20 || s[0].Target != 4 {
		t.Fatalf("stats %+v; want 200 MB held below a target of 4", s)
	}
}

// While every slot is busy (PoolConfig.Busy) the pool prepares nothing.
func TestPoolBusyStopsRefills(t *testing.T) {
	t.Parallel()
	var busy atomic.Bool
	busy.Store(true)
	f := newFakePool(t, PoolConfig{Max: 2, Min: 2, Busy: busy.Load})
	ctx := t.Context()
	f.seed(ctx)
	if _, ok := f.due(); !ok {
		t.Fatal("nothing due below Min")
	}
	if n := f.refillAll(ctx); n != 0 {
		t.Fatalf("refilled %d sandboxes while busy", n)
	}
	busy.Store(false)
	if n := f.refillAll(ctx); n != 2 {
		t.Fatalf("refilled %d once idle; want 2", n)
	}
}

// maintain asks the backend for each runtime's image and retires the idle
// sandboxes of a replaced one, which the next refills replace.
func TestPoolMaintainRetiresAReplacedImage(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 2, Min: 2})
	ctx := t.Context()
	f.seed(ctx)
	f.refillAll(ctx)
	f.maintain(ctx)
	if got := f.removedIDs(); len(got) != 0 {
		t.Fatalf("maintain removed %v of the current image", got)
	}
	f.backend.set(func(b *fakePoolBackend) { b.images["python"] = fakeRebuilt })
	f.maintain(ctx)
	if got := f.removedIDs(); !slices.Equal(got, []string{"pool-1", "pool-2"}) {
		t.Fatalf("removed %v; want both sandboxes of the replaced image", got)
	}
	if len(f.retired) != 2 {
		t.Fatalf("Retired signals %+v; want 2", f.retired)
	}
	f.refillAll(ctx)
	if sb := f.take(ctx, "python", fakeRebuilt, fakeClass); sb == nil || sb.img != fakeRebuilt {
		t.Fatalf("took %+v; want a sandbox of the new image", sb)
	}
}

// A sandbox whose preparation fails is removed and logged, and nothing is
// added to the pool.
func TestPoolFailedRefillRemovesItsSandbox(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 1, Min: 1})
	f.backend.set(func(b *fakePoolBackend) { b.fail = errors.New("launcher never started") })
	ctx, cancel := context.WithCancel(t.Context())
	f.seed(ctx)
	cancel() // the pause after a failure ends with the context
	if f.refillOne(ctx) {
		t.Fatal("a failed refill reported success")
	}
	if got := f.removedIDs(); !slices.Equal(got, []string{"pool-1"}) {
		t.Fatalf("removed %v; want the failed sandbox", got)
	}
	if logs := f.backend.logs.String(); !strings.Contains(logs, `msg="sandbox pool: prepare"`) || !strings.Contains(logs, "launcher never started") {
		t.Fatalf("log %q; want the failure", logs)
	}
	if s := f.Stats(); len(s) != 1 || s[0].Idle != 0 || s[0].Refills != 0 {
		t.Fatalf("stats %+v; want nothing pooled", s)
	}
}

// drain empties the pool for good: it returns the idle sandboxes, a
// sandbox prepared while it drained is removed, and nothing is due after.
func TestPoolDrainRemovesARefillInFlight(t *testing.T) {
	t.Parallel()
	f := newFakePool(t, PoolConfig{Max: 2, Min: 2})
	ctx := t.Context()
	f.seed(ctx)
	if !f.refillOne(ctx) {
		t.Fatal("nothing refilled below Min")
	}
	testkit.Receive(t, f.backend.calls, signalWait, "the first refill")
	gate := make(chan struct{})
	f.backend.set(func(b *fakePoolBackend) { b.gate = gate })
	refilled := make(chan bool, 1)
	go func() { refilled <- f.refillOne(ctx) }()
	inFlight := testkit.Receive(t, f.backend.calls, signalWait, "the refill in flight")
	drained := f.drain()
	if len(drained) != 1 || drained[0].id != "pool-1" {
		t.Fatalf("drain returned %v; want the idle pool-1", drained)
	}
	close(gate)
	if testkit.Receive(t, refilled, signalWait, "the refill's end") {
		t.Fatal("a sandbox prepared during the drain was pooled")
	}
	if got := f.removedIDs(); !slices.Equal(got, []string{inFlight}) {
		t.Fatalf("removed %v; want %s, prepared during the drain", got, inFlight)
	}
	if _, ok := f.due(); ok {
		t.Fatal("a drained pool still refills")
	}
	if f.take(ctx, "python", fakeImage, fakeClass) != nil {
		t.Fatal("a drained pool gave a sandbox")
	}
}
