package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// restorer is implemented by stores that re-create a lost record only
// within the record's lifetime (cache.Store).
type restorer interface {
	RestoreJob(ctx context.Context, msg job.Message, now time.Time) (bool, error)
}

// restoreRecord recreates the job's record from its message (status queued,
// as the producer first wrote it) and claims the job again.
func (d *delivery) restoreRecord(ctx context.Context) (job.Status, error) {
	if err := d.w.results.recreateRecord(ctx, d.log, d.m); err != nil {
		return "", err
	}
	d.span.AddEvent("job record restored from the job message")
	return d.markRunning(ctx)
}

// claimOrRestore is markRunning, and restoreRecord when the record is missing.
func (d *delivery) claimOrRestore(ctx context.Context) (job.Status, error) {
	status, err := d.markRunning(ctx)
	if errors.Is(err, cache.ErrNotFound) {
		// The store lost the record (Redis came back empty, or a failover to a
		// replica that lagged): the message carries everything the record
		// held at submission, so recreate it and run the job.
		status, err = d.restoreRecord(ctx)
	}
	return status, err
}

// recreateRecord recreates the job's record from its message, queued. A
// record that reappeared meanwhile (another delivery restored it first) is
// fine: CreateJob of the same message succeeds, and a different one is
// ErrExists, after which the caller's next call decides as usual. The error
// wraps cache.ErrNotFound when the record's lifetime is over.
func (rc *recorder) recreateRecord(ctx context.Context, log *slog.Logger, m job.Message) error {
	restored := true
	err := rc.sw.retry(ctx, log, func(c context.Context) error {
		if r, ok := rc.store.(restorer); ok {
			var err error
			restored, err = r.RestoreJob(c, m, rc.clock.Now())
			return err
		}
		err := rc.store.CreateJob(c, m)
		if errors.Is(err, cache.ErrExists) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("restore record of job %s: %w", m.ID, err)
	}
	if !restored {
		// The record's lifetime is over: it expired rather than got lost,
		// and nobody could read a result now.
		return fmt.Errorf("restore record of job %s: its lifetime is over: %w", m.ID, cache.ErrNotFound)
	}
	log.WarnContext(ctx, "job record was missing from the store; restored it from the job message")
	rc.metrics.RecordRestored(ctx, m.Spec.Runtime)
	return nil
}
