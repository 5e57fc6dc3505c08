package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A panic while one job is handled fails that job alone: it is retried
// like any platform failure and, its deliveries spent, recorded as a
// retryable internal error; the job running beside it in the other slot
// finishes on its first attempt, and the worker goes on taking jobs.
func TestPanicFailsOnlyItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2})
	slowRunning, releaseSlow := make(chan struct{}), make(chan struct{})
	var panics atomic.Int64
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		switch spec.Code {
		case "panic()":
			panics.Add(1)
			var m map[string]int
			m["boom"]++ // a nil map write: a real runtime panic
		case "slow()":
			close(slowRunning)
			select {
			case <-releaseSlow:
			case <-ctx.Done():
				return job.Result{}, context.Cause(ctx)
			}
		}
		return testkit.Succeed(ctx, id, spec)
	}}
	stop := b.start(t, rt, nil) // two slots
	slow := b.submit(t, "slow()")
	<-slowRunning
	boom := b.submit(t, "panic()")

	rec := b.waitTerminal(t, boom, 20*time.Second)
	if rec.Status != job.StatusInternalError || rec.Result == nil || rec.Result.Error == nil ||
		rec.Result.Error.Category != job.CategoryInternal || !rec.Result.Error.Retryable ||
		!strings.Contains(rec.Result.Error.Message, "panic") {
		t.Fatalf("panicking job: %+v result %+v", rec, rec.Result)
	}
	if n := panics.Load(); n != 2 {
		t.Fatalf("the panicking job ran %d times; want 2 (one per delivery)", n)
	}

	close(releaseSlow)
	rec = b.waitTerminal(t, slow, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 1 {
		t.Fatalf("the job beside it: %+v result %+v; want succeeded on attempt 1", rec, rec.Result)
	}
	after := b.submit(t, "print(2)")
	if rec := b.waitTerminal(t, after, 10*time.Second); rec.Status != job.StatusSucceeded {
		t.Fatalf("a job after the panic: %+v", rec)
	}
	stop() // Run returns nil: the worker survived
}
