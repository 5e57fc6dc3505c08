package box

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
)

// The fakes the box source's unit tests (box_source_test.go) run on.

// fakeMaker makes fake boxes at once (or, held, once released) and records
// what it made and ended.
type fakeMaker struct {
	clock *testkit.Clock
	// calls hears of every makeBox call, before it waits on the gate.
	calls chan string

	mu         sync.Mutex
	made       []string
	ended      []string
	peak       int   // most boxes alive at once (made and not ended)
	fail       error // what MakeBox fails with
	gate       chan struct{}
	gateClosed bool
}

func (f *fakeMaker) MakeBox(_ context.Context, _ testClass, _ string) (*fakeBox, error) {
	f.mu.Lock()
	id := fmt.Sprintf("box-%d", len(f.made)+1)
	f.made = append(f.made, id)
	f.peak = max(f.peak, len(f.made)-len(f.ended))
	err, gate := f.fail, f.gate
	f.mu.Unlock()
	f.calls <- id
	if gate != nil {
		<-gate
	}
	// A failed box may exist in part: it is the source's to end.
	return &fakeBox{id: id, prepared: f.clock.Now()}, err
}

func (f *fakeMaker) EndBox(_ context.Context, sb *fakeBox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, sb.id)
}

// hold makes the next MakeBox calls wait until release.
func (f *fakeMaker) hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate, f.gateClosed = make(chan struct{}), false
}

func (f *fakeMaker) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate != nil && !f.gateClosed {
		close(f.gate)
		f.gateClosed = true
	}
	f.gate = nil
}

func (f *fakeMaker) failWith(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

// counts is how many boxes were made and ended so far.
func (f *fakeMaker) counts() (made, ended int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.made), len(f.ended)
}

func (f *fakeMaker) endedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := slices.Clone(f.ended)
	slices.Sort(ids)
	return ids
}

// boxSetup is a box source over a fake maker on a manual clock, stopped
// (every creation released and waited for) when the test ends.
type boxSetup struct {
	bx    *Source[*fakeBox, testClass, string]
	maker *fakeMaker
	clock *testkit.Clock
	logs  *testkit.SyncBuffer
}

func newBoxSetup(t *testing.T, cfg Config) *boxSetup {
	t.Helper()
	s := &boxSetup{clock: testkit.NewClock(time.Time{}), logs: &testkit.SyncBuffer{}}
	s.maker = &fakeMaker{clock: s.clock, calls: make(chan string, 1024)}
	cfg.Now = s.clock.Now
	// The facade's defaults (sandbox.BoxConfig).
	cfg.Max, cfg.MaxAge, cfg.Neutral = cmp.Or(cfg.Max, 8), cmp.Or(cfg.MaxAge, 30*time.Minute), cmp.Or(cfg.Neutral, 1)
	s.bx = NewSource[*fakeBox, testClass, string](s.maker, cfg, slog.New(slog.NewTextHandler(s.logs, nil)))
	s.bx.after = s.clock.After
	t.Cleanup(func() {
		s.maker.release()
		s.bx.Stop(context.Background())
		s.settle(t)
	})
	return s
}

// settle waits for the creations under way.
func (s *boxSetup) settle(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.bx.Settle(ctx); err != nil {
		t.Fatalf("creations still under way: %v", err)
	}
}

// signalWait bounds a test's wait for a signal of the code under test.
const signalWait = 30 * time.Second

func key(tenant string, cls testClass) Key[testClass] {
	return Key[testClass]{Tenant: tenant, Class: cls}
}

// fakeBox is a box of the fake maker: its tenant, when it was made and
// last used, and whether its task ended (exitCh closed).
type fakeBox struct {
	id       string
	tenant   string
	prepared time.Time
	lastUsed time.Time
	exitCh   chan struct{}
}

func (b *fakeBox) Prepared() time.Time { return b.prepared }
func (b *fakeBox) LastUsed() time.Time { return b.lastUsed }
func (b *fakeBox) Claim(tenant string) { b.tenant = tenant }

func (b *fakeBox) ExitedIdle() bool {
	select {
	case <-b.exitCh:
		return true
	default:
		return false
	}
}

// testClass is a limits class: a runtime and a disk size.
type testClass struct {
	runtime string
	diskMB  int64
}

func (c testClass) Runtime() string { return c.runtime }

var (
	fakeImage    = "image v1"
	fakeClass    = testClass{runtime: "python", diskMB: 64}
	fakeBigClass = testClass{runtime: "python", diskMB: 512}
)
