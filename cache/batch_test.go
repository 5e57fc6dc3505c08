package cache

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/internal/testkit"
)

// pipelineSizes records the size of every pipeline a client sends.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (h *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.sizes = append(h.sizes, len(cmds))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// echo is an ECHO of arg, or a command Redis refuses for "fail".
func echo(ctx context.Context, arg string) *redis.Cmd {
	if arg == "fail" {
		return redis.NewCmd(ctx, "no-such-command", arg)
	}
	return redis.NewCmd(ctx, "echo", arg)
}

// Calls queued while a pipeline runs go out together in the next one, led
// by one of their callers, and each caller gets its own commands' answers,
// an error included.
func TestPipeBatchQueuesCallsIntoOnePipeline(t *testing.T) {
	t.Parallel()
	_, r := setup(t, Config{})
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &pipelineSizes{}
	rdb.AddHook(hook)
	ctx := context.Background()

	var b pipeBatch
	b.running = true // as if a caller's pipeline were running
	const n = 5
	cmds := make([][2]*redis.Cmd, n)
	var wg sync.WaitGroup
	for i := range n {
		arg := fmt.Sprint("call-", i)
		if i == 3 {
			arg = "fail"
		}
		cmds[i] = [2]*redis.Cmd{echo(ctx, arg), echo(ctx, arg+"-2")}
		wg.Go(func() { b.run(ctx, rdb, cmds[i][0], cmds[i][1]) })
	}
	testkit.Eventually(t, 5*time.Second, "5 queued calls", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == n
	})
	// The running pipeline ends: it hands the queue to its first caller.
	b.mu.Lock()
	next := b.queue[0]
	b.mu.Unlock()
	next.done <- true
	wg.Wait()

	for i := range n {
		first, second := cmds[i][0], cmds[i][1]
		if i == 3 {
			if first.Err() == nil || second.Val() != "fail-2" {
				t.Errorf("call %d = %v, %v; want the refusal, then its second answer", i, first.Err(), second.Val())
			}
			continue
		}
		if want := fmt.Sprint("call-", i); first.Val() != want || second.Val() != want+"-2" {
			t.Errorf("call %d = %v (%v), %v (%v); want %q and its second", i, first.Val(), first.Err(), second.Val(), second.Err(), want)
		}
	}
	hook.mu.Lock()
	sizes := hook.sizes
	hook.mu.Unlock()
	// (A new connection's hand-shake is a pipeline of its own.)
	if !slices.Contains(sizes, 2*n) {
		t.Fatalf("pipelines sent: %v; want one holding all %d calls' %d commands", sizes, n, 2*n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running || len(b.queue) != 0 {
		t.Fatalf("after the pipeline: running %v, %d queued; want neither", b.running, len(b.queue))
	}
}

// Many concurrent callers each get their own answers, whatever pipelines
// their calls rode in, and no other caller's command comes between a
// caller's commands (each caller sets one key and reads it back).
func TestPipeBatchConcurrentCallers(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	var b pipeBatch
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			const key = "batch-test"
			for i := range 50 {
				want := fmt.Sprint(g, "-", i)
				set := redis.NewStatusCmd(ctx, "set", key, want)
				get := redis.NewStringCmd(ctx, "get", key)
				b.run(ctx, s.rdb, set, get)
				if got, err := get.Result(); got != want || err != nil || set.Err() != nil {
					t.Errorf("run(set, get %q) = %v, %v, %v", want, got, err, set.Err())
					return
				}
			}
		})
	}
	wg.Wait()
}
