package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
)

// legacyRetireEvery is how often the worker looks again for an earlier
// version's consumers of the job stream while some are left.
const legacyRetireEvery = time.Minute

// retireLegacyConsumers deletes an earlier version's per-tenant consumers
// of the job stream (queue.RetireLegacyConsumers) once the jobs they
// delivered have ended: the jobs queued on their subjects are this
// version's backlogs and run as they are. It looks at start and then every
// legacyRetireEvery until none is left or ctx ends.
func (w *Worker) retireLegacyConsumers(ctx context.Context) {
	for {
		left, err := queue.RetireLegacyConsumers(ctx, w.js)
		if err != nil && ctx.Err() == nil {
			w.log.WarnContext(ctx, "retire the previous version's job consumers", slog.Any("error", err))
		}
		if left == 0 && err == nil {
			return
		}
		if left > 0 {
			w.log.InfoContext(ctx, "the previous version's job consumers still hold running jobs; retiring them when those end", slog.Int("consumers", left))
		}
		select {
		case <-ctx.Done():
			return
		case <-w.cfg.Clock.After(legacyRetireEvery):
		}
	}
}
