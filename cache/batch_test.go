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

// echoScript answers its argument, or an error for "fail".
var echoScript = redis.NewScript(`
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return ARGV[1]
`)

// Calls queued while a pipeline runs go out together in the next one, led
// by one of their callers, and each caller gets its own call's answer, an
// error included. Redis not knowing the script (SCRIPT FLUSH) costs a retry.
func TestScriptBatchQueuesCallsIntoOnePipeline(t *testing.T) {
	t.Parallel()
	_, r := setup(t, Config{})
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &pipelineSizes{}
	rdb.AddHook(hook)
	ctx := context.Background()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	b := &scriptBatch{script: echoScript}
	b.running = 1 // as if a caller's pipeline were running
	const n = 5
	got := make([]any, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		arg := fmt.Sprint("call-", i)
		if i == 3 {
			arg = "fail"
		}
		wg.Go(func() { got[i], errs[i] = b.run(ctx, rdb, nil, arg) })
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
		if i == 3 {
			if errs[i] == nil {
				t.Errorf("call %d: no error, want the script's", i)
			}
			continue
		}
		if want := fmt.Sprint("call-", i); got[i] != want || errs[i] != nil {
			t.Errorf("call %d = %v, %v; want %q", i, got[i], errs[i], want)
		}
	}
	hook.mu.Lock()
	sizes := hook.sizes
	hook.mu.Unlock()
	// (A new connection's hand-shake is a pipeline of its own.)
	if !slices.Contains(sizes, n) {
		t.Fatalf("pipelines sent: %v; want one holding all %d calls", sizes, n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running != 0 || len(b.queue) != 0 {
		t.Fatalf("after the pipeline: %d running, %d queued; want none", b.running, len(b.queue))
	}
}

// Many concurrent callers each get their own answer, whatever pipelines
// their calls rode in.
func TestScriptBatchConcurrentCallers(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	b := &scriptBatch{script: echoScript}
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				want := fmt.Sprint(g, "-", i)
				if v, err := b.run(ctx, s.rdb, nil, want); v != want || err != nil {
					t.Errorf("run(%q) = %v, %v", want, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
