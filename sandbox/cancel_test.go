package sandbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	spec := py("import time\nprint('started', flush=True)\ntime.sleep(60)")
	spec.Limits.TimeoutMS = 60_000
	done := make(chan struct{})
	var res job.Result
	var err error
	id := job.NewID()
	go func() {
		defer close(done)
		res, err = rt.Run(ctx, Request{ID: id, Spec: spec})
	}()
	// Cancel once the job is certainly running: its container exists.
	key := waitForContainer(t, rt, id)
	running := pidsInCgroupOf(t, key)
	if n := len(running) - supervisorsOf(key); n <= 0 {
		t.Error("no host process found in the running job's cgroup; the leftover checks could not see one either")
	}
	start := time.Now()
	cancel()
	<-done
	if underGVisor() {
		// runsc's own processes (the sentry, the gofer) leave with the
		// container, which is removed after the answer; the job's are
		// inside the sentry.
		sctx, scancel := context.WithTimeout(t.Context(), time.Minute)
		_ = rt.Settle(sctx)
		scancel()
	}
	// What is left of the job: the processes that were there while it ran,
	// but for a box's supervisors. (A kept box makes its next job's sandbox
	// as soon as this one ends: those processes are new.)
	left := 0
	for _, pid := range pidsInCgroupOf(t, key) {
		if slices.Contains(running, pid) {
			left++
		}
	}
	if n := left - supervisorsOf(key); n > 0 {
		t.Errorf("%d processes of the cancelled job left in its cgroup", n)
	}
	if err != nil || res.Status != job.StatusCanceled || res.Error == nil || res.Error.Category != job.CategoryCanceled {
		t.Fatalf("got %s %+v, err %v; want canceled", res.Status, res.Error, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancel took %s", d)
	}
	healthy(t, rt)
}
