package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
)

// startingRuntime records Start calls and whether the worker had taken its
// id (and so reaped its predecessor's containers) by then.
type startingRuntime struct {
	*testkit.Runtime
	starts  atomic.Int32
	reaped  atomic.Bool
	started chan struct{}
}

func (r *startingRuntime) ReapOrphans(context.Context, string) (int, error) {
	r.reaped.Store(true)
	return 0, nil
}

func (r *startingRuntime) Start(context.Context) error {
	if r.starts.Add(1) == 1 {
		close(r.started)
	}
	return nil
}

// The worker starts its runtime's background work (the warm pool) once,
// after it holds its id and has reaped what a predecessor left, and jobs run.
func TestRunStartsTheRuntimeAfterReaping(t *testing.T) {
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	rt := &startingRuntime{Runtime: &testkit.Runtime{Script: testkit.Succeed}, started: make(chan struct{})}
	b.start(t, rt, nil)
	testkit.Closed(t, rt.started, 20*time.Second, "the worker to start its runtime")
	if !rt.reaped.Load() {
		t.Error("the runtime started before the worker reaped its predecessor's containers")
	}
	id := b.submit(t, "print(1)")
	b.waitTerminal(t, id, 20*time.Second)
	if n := rt.starts.Load(); n != 1 {
		t.Errorf("Start called %d times; want 1", n)
	}
}
