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

// A job's message is acked (or termed) only once its terminal state is
// durable: with cache.Config.MinReplicas set, the store confirms that many
// Redis replicas hold it (WAIT) or answers cache.ErrNotReplicated. Acking
// before that would let a failover to a replica that lagged revert the job
// to queued or running with no message left to run it again.
//
// While the confirmation is missing (a replica cut off, a failover under
// way, a new primary with no replica yet), the worker keeps the message in
// progress (the heartbeat goes on) and writes the same result again with
// back-off, against whichever server is primary by then: the first write
// stands on the old primary if it lives, and on a new primary that lacks it
// the write is made again (restoring the record from the message first if it
// vanished). The job keeps its slot meanwhile, so a fleet whose replicas are
// gone stops taking new jobs once its slots are full instead of piling up
// results it cannot make durable.
//
// There is no time limit while the worker lives: giving the message back
// would not help, for any other worker would have to wait for the same
// replicas. A worker that stops waits within its drain grace period like a
// running job, then hands the message back; the delivery that takes it finds
// the result recorded and confirms it (confirmTerminal) before acking, or,
// if a failover lost the result, runs the job again.

// confirmBackoff bounds the pause between two tries of an unconfirmed write;
// each try also waits up to cache.Config.ReplicaWait inside WAIT.
const confirmBackoff = 2 * time.Second

// writeResult writes r as the job's terminal result (Store.Finish, or
// Store.Abandon) and returns once the store confirms it durable. won is as
// for Finish, from the last try. It fails only when ctx ends, when the
// record's lifetime is over (cache.ErrNotFound), or on an error no retry can
// fix.
func (rc *recorder) writeResult(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, abandon bool) (won bool, err error) {
	if r.FinishedAt == nil {
		// Every try writes the very same result, so that the store sees a
		// repeat of its own write, not a rival's.
		r.FinishedAt = ptr(rc.clock.Now().UTC())
	}
	var since time.Time // when the first try fell short
	delay := 100 * time.Millisecond
	restored := false
	for {
		err = rc.sw.retryWhileLeased(ctx, log, func(c context.Context) error {
			var err error
			if abandon {
				won, err = rc.store.Abandon(c, m.ID, r)
			} else {
				won, err = rc.store.Finish(c, m.ID, r)
			}
			return err
		}, nil)
		switch {
		case err == nil:
			if !since.IsZero() {
				log.InfoContext(ctx, "terminal result now held by the replicas; acking",
					slog.Duration("waited", time.Since(since).Round(time.Millisecond)), slog.Bool("won", won))
			}
			return won, nil
		case errors.Is(err, cache.ErrNotFound) && !restored:
			// The record vanished (a failover to a replica that had not
			// received it): recreate it from the message and write the
			// result in hand, rather than run the job again.
			if err := rc.recreateRecord(ctx, log, m); err != nil {
				return false, fmt.Errorf("write result of job %s: %w", m.ID, err)
			}
			restored = true
			continue
		case errors.Is(err, cache.ErrNotReplicated), errors.Is(err, cache.ErrNotFound):
			if since.IsZero() {
				since = time.Now()
				log.WarnContext(ctx, "terminal result not yet held by enough replicas; keeping the job's message and writing again", slog.Any("error", err))
			}
			restored = false // a second failover may take it again
		default:
			return won, fmt.Errorf("write result of job %s: %w", m.ID, err)
		}
		if !sleep(ctx, delay) {
			return won, fmt.Errorf("write result of job %s: worker stopping before the replicas confirmed it: %w", m.ID, context.Cause(ctx))
		}
		delay = min(delay*2, confirmBackoff)
	}
}

// confirmTerminal makes sure the terminal state a claim found is durable
// before the caller acks (see above): the attempt that wrote it may have been
// stopped before the replicas confirmed it. durable is false when the
// record is no longer terminal, or gone: a failover lost that state, and the
// caller claims the job again. It fails only when ctx ends or on an error no
// retry can fix.
func (d *delivery) confirmTerminal(ctx context.Context) (durable bool, err error) {
	w, log, id := d.w, d.log, d.m.ID
	var since time.Time
	delay := 100 * time.Millisecond
	for {
		var st job.Status
		err := w.storeWatch.retry(ctx, log, func(c context.Context) error {
			var err error
			st, err = w.cfg.Store.ConfirmTerminal(c, id)
			return err
		})
		switch {
		case err == nil:
			if !since.IsZero() {
				log.InfoContext(ctx, "terminal state now held by the replicas", slog.Duration("waited", time.Since(since).Round(time.Millisecond)))
			}
			return st.Terminal(), nil
		case errors.Is(err, cache.ErrNotFound):
			return false, nil
		case errors.Is(err, cache.ErrNotReplicated):
			if since.IsZero() {
				since = time.Now()
				log.WarnContext(ctx, "job already terminal but not yet held by enough replicas; keeping its message", slog.Any("error", err))
			}
		default:
			return false, fmt.Errorf("confirm terminal state of job %s: %w", id, err)
		}
		if !sleep(ctx, delay) {
			return false, fmt.Errorf("confirm terminal state of job %s: worker stopping: %w", id, context.Cause(ctx))
		}
		delay = min(delay*2, confirmBackoff)
	}
}
