package worker

import (
	"context"
	"time"
)

// onTicks calls f every d until ctx ends; not at once (its callers make
// the first check themselves). The worker's probes and a job's heartbeats
// run on it.
func onTicks(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}
