package cache

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// pipeBatch sends the commands of concurrent callers as pipelines: a
// caller that finds no pipeline running sends its commands with every
// call queued so far in one pipeline; calls arriving meanwhile queue and,
// when that pipeline is answered, one of their callers sends them all in
// the next. Under load a cache-hit burst then costs Redis and this process
// one write and one read per pipeline instead of one per call; an idle
// caller goes alone at once. No caller sends other callers' commands
// beyond the one pipeline it leads, and no goroutine outlives a call.
// (A second pipeline in flight was measured: no faster, see
// docs/benchmarks.md.)
type pipeBatch struct {
	mu      sync.Mutex
	running bool
	queue   []*batchCall // calls waiting for the next pipeline
}

// batchCall is one caller's commands, built by its caller (not by the one
// leading its pipeline). done receives true when its caller is to send the
// queue, or false once the commands have their replies.
type batchCall struct {
	cmds []redis.Cmder
	done chan bool
}

// run sends cmds, in order and with no other caller's commands between
// them, and returns once each holds its reply (or error). The pipeline a
// call rides in is not canceled with any one caller's ctx; it is bounded
// by the Store's read and write timeouts.
func (b *pipeBatch) run(ctx context.Context, rdb *redis.Client, cmds ...redis.Cmder) {
	ctx = context.WithoutCancel(ctx)
	c := &batchCall{cmds: cmds, done: make(chan bool, 1)}
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
	calls := b.queue
	b.queue = nil
	b.mu.Unlock()
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, call := range calls {
			for _, cmd := range call.cmds {
				_ = p.Process(ctx, cmd)
			}
		}
		return nil
	})
	for _, o := range calls {
		if o != c {
			o.done <- false
		}
	}
	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.mu.Unlock()
		next.done <- true // leads the next pipeline
	} else {
		b.running = false
		b.mu.Unlock()
	}
}
