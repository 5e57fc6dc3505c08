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

// batchCall is one call of the script, its command built by its caller
// (not by the one leading its pipeline). done receives true when its caller
// is to run the queue, or false once the command has its reply.
type batchCall struct {
	keys []string
	args []any
	cmd  *redis.Cmd
	done chan bool
}

// run calls the script with keys and args and returns its reply. The
// pipeline a call rides in is not canceled with any one caller's ctx; it
// is bounded by the Store's read and write timeouts.
func (b *scriptBatch) run(ctx context.Context, rdb *redis.Client, keys []string, args ...any) (any, error) {
	ctx = context.WithoutCancel(ctx)
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", b.script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	c := &batchCall{keys: keys, args: args, cmd: redis.NewCmd(ctx, append(cmdArgs, args...)...), done: make(chan bool, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.running >= max(b.pipelines, 1) {
		b.mu.Unlock()
		if lead := <-c.done; !lead {
			return c.cmd.Result()
		}
	} else {
		b.running++
		b.mu.Unlock()
	}
	b.mu.Lock()
	calls := b.queue
	b.queue = nil
	b.mu.Unlock()
	b.exec(ctx, rdb, calls)
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
	return c.cmd.Result()
}

// exec runs calls as one pipeline of EVALSHA, and any that Redis did not
// know the script for (after a restart or SCRIPT FLUSH) again with EVAL.
func (b *scriptBatch) exec(ctx context.Context, rdb *redis.Client, calls []*batchCall) {
	if len(calls) == 1 {
		_ = rdb.Process(ctx, calls[0].cmd)
	} else {
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range calls {
				_ = p.Process(ctx, c.cmd)
			}
			return nil
		})
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			c.cmd = b.script.Run(ctx, rdb, c.keys, c.args...)
		}
	}
}
