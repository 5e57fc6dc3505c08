package cache

import "sync"

// batcher sends the calls of concurrent callers in batches: a caller that
// finds no batch being sent sends its call with every call queued so far;
// calls arriving meanwhile queue and, when that batch is answered, one of
// their callers sends them all in the next. Under load a cache-hit burst
// then costs Redis and this process one write and one read per batch
// instead of one per call; an idle caller goes alone at once. No caller
// sends other callers' calls beyond the one batch it leads, and no
// goroutine outlives a call. (A second batch in flight was measured: no
// faster, see docs/benchmarks.md.)
type batcher[T any] struct {
	// send sends calls as one batch (one pipeline) and sets each call's
	// outcome before it returns.
	send    func(calls []T)
	mu      sync.Mutex
	running bool
	queue   []*batched[T] // calls waiting for the next batch
}

// batched is a queued call. done receives true when its caller is to send
// the queue, or false once the call has its outcome.
type batched[T any] struct {
	call T
	done chan bool
}

// run sends call, in a batch with other callers' calls, and returns once
// send has set its outcome.
func (b *batcher[T]) run(call T) {
	c := &batched[T]{call: call, done: make(chan bool, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.running {
		b.mu.Unlock()
		if lead := <-c.done; !lead {
			return
		}
	} else {
		b.running = true
		b.mu.Unlock()
	}
	b.mu.Lock()
	queued := b.queue
	b.queue = nil
	b.mu.Unlock()
	calls := make([]T, len(queued))
	for i, q := range queued {
		calls[i] = q.call
	}
	b.send(calls)
	for _, q := range queued {
		if q != c {
			q.done <- false
		}
	}
	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.mu.Unlock()
		next.done <- true // leads the next batch
	} else {
		b.running = false
		b.mu.Unlock()
	}
}
