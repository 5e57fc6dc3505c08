package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
)

// echoCall is a call whose outcome is its argument, set by the batch.
type echoCall struct {
	arg, got string
}

// echoBatcher is a batcher whose batches answer each call with its
// argument and note their sizes.
func echoBatcher() (*batcher[*echoCall], func() []int) {
	var mu sync.Mutex
	var sizes []int
	b := &batcher[*echoCall]{send: func(calls []*echoCall) {
		mu.Lock()
		sizes = append(sizes, len(calls))
		mu.Unlock()
		for _, c := range calls {
			c.got = c.arg
		}
	}}
	return b, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sizes)
	}
}

// Calls queued while a batch is being sent go out together in the next
// one, led by one of their callers, and each caller returns with its own
// call's outcome.
func TestBatcherQueuesCallsIntoOneBatch(t *testing.T) {
	t.Parallel()
	b, sizes := echoBatcher()
	b.running = true // as if a caller's batch were being sent
	const n = 5
	calls := make([]*echoCall, n)
	var wg sync.WaitGroup
	for i := range n {
		calls[i] = &echoCall{arg: fmt.Sprint("call-", i)}
		wg.Go(func() { b.run(calls[i]) })
	}
	testkit.Eventually(t, 5*time.Second, "5 queued calls", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == n
	})
	// The running batch ends: it hands the queue to its first caller.
	b.mu.Lock()
	next := b.queue[0]
	b.mu.Unlock()
	next.done <- true
	wg.Wait()

	for i, c := range calls {
		if c.got != c.arg {
			t.Errorf("call %d = %q, want %q", i, c.got, c.arg)
		}
	}
	if got := sizes(); !slices.Equal(got, []int{n}) {
		t.Fatalf("batches sent: %v; want one of all %d calls", got, n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running || len(b.queue) != 0 {
		t.Fatalf("after the batch: running %v, %d queued; want neither", b.running, len(b.queue))
	}
}

// Many concurrent callers each get their own outcome, every call is sent
// exactly once, and an idle caller's call goes alone at once.
func TestBatcherConcurrentCallers(t *testing.T) {
	t.Parallel()
	b, sizes := echoBatcher()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				c := &echoCall{arg: fmt.Sprint(g, "-", i)}
				if b.run(c); c.got != c.arg {
					t.Errorf("run(%q) = %q", c.arg, c.got)
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range sizes() {
		total += n
	}
	if total != 16*200 {
		t.Fatalf("%d calls sent, want %d", total, 16*200)
	}
	c := &echoCall{arg: "alone"}
	b.run(c)
	if s := sizes(); c.got != "alone" || s[len(s)-1] != 1 {
		t.Fatalf("an idle caller's call: %q in a batch of %d", c.got, s[len(s)-1])
	}
}
