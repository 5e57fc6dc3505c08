package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// restorer is implemented by stores that re-create a lost record only
// within the record's lifetime (cache.Store).
type restorer interface {
	RestoreJob(ctx context.Context, msg job.Message, now time.Time) (bool, error)
}

// restoreRecord recreates the job's record from its message (status queued,
// as the producer first wrote it) and claims the job again. A record that
// reappeared meanwhile (another delivery restored it first) is fine:
// CreateJob of the same message succeeds, and a different one is ErrExists,
// after which the claim decides as usual.
func (w *Worker) restoreRecord(ctx context.Context, log *slog.Logger, span trace.Span, m job.Message, attempt int, lease cache.Lease, startedAt *time.Time) (job.Status, error) {
	restored := true
	err := w.retryStore(ctx, log, func(c context.Context) error {
		if r, ok := w.cfg.Store.(restorer); ok {
			var err error
			restored, err = r.RestoreJob(c, m, time.Now())
			return err
		}
		err := w.cfg.Store.CreateJob(c, m)
		if errors.Is(err, cache.ErrExists) {
			return nil
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("restore record of job %s: %w", m.ID, err)
	}
	if !restored {
		// The record's lifetime is over: it expired rather than got lost,
		// and nobody could read a result now.
		return "", fmt.Errorf("restore record of job %s: its lifetime is over: %w", m.ID, cache.ErrNotFound)
	}
	log.WarnContext(ctx, "job record was missing from the store; restored it from the job message")
	span.AddEvent("job record restored from the job message")
	w.cfg.Metrics.RecordRestored(ctx, m.Spec.Runtime)
	return w.claim(ctx, log, span, m.ID, attempt, lease, startedAt)
}

// probeStore lifts the pause on pulls as soon as the store answers a PING,
// so a worker whose store came back (in any state, even empty, where no
// held job has a write left to make) resumes pulling within a probe interval.
func (w *Worker) probeStore(ctx context.Context) {
	t := time.NewTicker(w.cfg.StoreProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.storeOK.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, w.cfg.StoreProbe)
		err := w.cfg.Store.Ping(pctx)
		cancel()
		if err == nil && !w.storeOK.Swap(true) {
			w.log.InfoContext(ctx, "store answers again; resuming pulls")
		}
	}
}

// finishLost records r for a job whose record the store lost while the job
// ran (Redis came back empty): it recreates the record from the message and
// writes r to it. Handing the job back instead would run its code a second
// time for a result that is already there.
func (w *Worker) finishLost(ctx context.Context, log *slog.Logger, m job.Message, r job.Result) (bool, error) {
	restored := true
	var err error
	if rs, ok := w.cfg.Store.(restorer); ok {
		restored, err = rs.RestoreJob(ctx, m, time.Now())
	} else if err = w.cfg.Store.CreateJob(ctx, m); errors.Is(err, cache.ErrExists) {
		err = nil
	}
	if err != nil {
		return false, fmt.Errorf("restore record of job %s to record its result: %w", m.ID, err)
	}
	if !restored {
		return false, fmt.Errorf("restore record of job %s: its lifetime is over: %w", m.ID, cache.ErrNotFound)
	}
	log.WarnContext(ctx, "job record went missing while the job ran; restored it from the job message to record the result")
	w.cfg.Metrics.RecordRestored(ctx, m.Spec.Runtime)
	return w.cfg.Store.Finish(ctx, m.ID, r)
}
