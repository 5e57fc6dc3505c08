package worker

import (
	"sync"

	"golang.org/x/sync/errgroup"
)

// tasks owns the goroutines that NATS handlers start for the worker (a
// max-deliveries advisory's give-up, another worker's reap request), so that
// Run can wait for them: a handler may still be called after its
// subscription is dropped, and a task it starts then is not started at all.
type tasks struct {
	mu     sync.Mutex
	closed bool
	g      errgroup.Group
}

// Go runs f on its own goroutine, unless wait has begun.
func (t *tasks) Go(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.g.Go(func() error { f(); return nil })
}

// wait refuses new tasks and returns once every started one has ended.
func (t *tasks) wait() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	_ = t.g.Wait()
}
