package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/job"
)

// restorer is implemented by stores that can re-create a lost job record
// from the job's queue message (cache.Store).
type restorer interface {
	RestoreJob(ctx context.Context, msg job.Message, now time.Time) (bool, error)
}

// restore re-creates m's record when the store has none although the job's
// message is still queued: Redis lost it (a restart without persistence, a
// failover to a replica the write had not reached). It reports whether the
// record is back, so the job can be claimed again; false (the record's
// lifetime is over, or the store cannot restore) leaves the message to be
// dropped as before.
func (w *Worker) restore(ctx context.Context, log *slog.Logger, m job.Message) bool {
	r, ok := w.cfg.Store.(restorer)
	if !ok {
		return false
	}
	restored := false
	err := w.retryStore(ctx, log, func(c context.Context) error {
		var err error
		restored, err = r.RestoreJob(c, m, time.Now())
		return err
	})
	if err != nil || !restored {
		return false
	}
	log.WarnContext(ctx, "job record was missing; restored it from the queue message")
	return true
}
