package cache

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// scriptBatch runs the calls of one script made by concurrent callers as
// pipelines: a caller that finds no pipeline running runs its call with
// every call queued so far in one pipeline; calls arriving meanwhile queue
// and, when that pipeline is answered, one of their callers runs them all
// in the next. Under load a cache-hit burst then costs Redis and this
// process one write and one read per pipeline instead of one per call; an
// idle caller runs alone at once. No caller runs other callers' calls
// beyond the one pipeline it leads, and no goroutine outlives a call.
type scriptBatch struct {
	script *redis.Script
	// pipelines bounds the pipelines running at once (at least 1).
	pipelines int
	mu        sync.Mutex
	running   int          // pipelines running
	queue     []*batchCall // calls waiting for the next pipeline
}

// batchCall is one call of the script. done receives true when its caller
// is to run the queue, or false once val and err are set.
type batchCall struct {
	keys []string
	args []any
	val  any
	err  error
	done chan bool
}

// run calls the script with keys and args and returns its reply. The
// pipeline a call rides in is not canceled with any one caller's ctx; it
// is bounded by the Store's read and write timeouts.
func (b *scriptBatch) run(ctx context.Context, rdb *redis.Client, keys []string, args ...any) (any, error) {
	c := &batchCall{keys: keys, args: args, done: make(chan bool, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.running >= max(b.pipelines, 1) {
		b.mu.Unlock()
		if lead := <-c.done; !lead {
			return c.val, c.err
		}
	} else {
		b.running++
		b.mu.Unlock()
	}
	b.mu.Lock()
	calls := b.queue
	b.queue = nil
	b.mu.Unlock()
	b.exec(context.WithoutCancel(ctx), rdb, calls)
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
		b.running--
		b.mu.Unlock()
	}
	return c.val, c.err
}

// exec runs calls as one pipeline of EVALSHA, and any that Redis did not
// know the script for (after a restart or SCRIPT FLUSH) again with EVAL.
func (b *scriptBatch) exec(ctx context.Context, rdb *redis.Client, calls []*batchCall) {
	if len(calls) == 1 {
		c := calls[0]
		c.val, c.err = b.script.Run(ctx, rdb, c.keys, c.args...).Result()
		return
	}
	cmds := make([]*redis.Cmd, len(calls))
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = b.script.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	for i, c := range calls {
		c.val, c.err = cmds[i].Result()
		if c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.val, c.err = b.script.Run(ctx, rdb, c.keys, c.args...).Result()
		}
	}
}
