package worker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// leaseState is this delivery's lease on the job. The token is unique to
// the delivery, so two deliveries of the same job never share a lease, even
// on one worker.
type leaseState struct {
	cache.Lease
	held      atomic.Bool // set once claim got the job; cleared when the lease is given up or lost
	finishing atomic.Bool // the run is over: the job turning terminal under us is expected
}

// markRunning marks the job running under the delivery's lease, of AckWait. While another attempt
// holds a live lease (the queue redelivered the job because it lost that
// worker's heartbeats, not because the worker died), it holds this delivery,
// kept alive by the heartbeat, and asks again until the job is terminal
// (the caller acks) or the lease lapses (this attempt takes over). startedAt
// moves to the moment the job was taken.
func (d *delivery) markRunning(ctx context.Context) (job.Status, error) {
	w, log, span, id, attempt, lease, startedAt := d.w, d.log, d.span, d.m.ID, d.attempt, d.lease.Lease, &d.startedAt
	var status job.Status
	waited := false
	err := w.storeWatch.retryWhileLeased(ctx, log, func(c context.Context) error {
		if waited {
			*startedAt = w.cfg.Clock.Now()
		}
		var err error
		status, err = w.cfg.Store.MarkRunningLeased(c, id, w.cfg.ID, attempt, *startedAt, lease)
		return err
	}, func(err error) {
		fire(w.cfg.Hooks.Held, Event{JobID: id, Attempt: attempt})
		if !waited {
			waited = true
			log.InfoContext(ctx, "job is running elsewhere; holding this delivery until that run ends", slog.Any("reason", err))
			span.AddEvent("waiting for the attempt holding the lease", trace.WithAttributes(attribute.String("reason", err.Error())))
		}
	})
	if waited && err == nil {
		log.InfoContext(ctx, "done waiting for the other attempt", slog.String("status", string(status)))
	}
	return status, err
}

// handBack releases the job's lease and naks the message, so that its
// redelivery can start at once instead of waiting for the lease to lapse.
func (d *delivery) handBack(ctx context.Context, delay time.Duration) {
	w, log, msg, id, lease := d.w, d.log, d.msg, d.m.ID, d.lease
	if lease.held.Swap(false) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if _, err := w.cfg.Store.ReleaseLease(rctx, id, lease.Token); err != nil {
			log.WarnContext(ctx, "release lease; the redelivery waits for it to lapse", slog.Any("error", err))
		}
		cancel()
	}
	_ = msg.NakWithDelay(delay)
	if w.cfg.Hooks.HandedBack != nil {
		e := Event{JobID: id}
		if meta, err := msg.Metadata(); err == nil {
			e.Attempt = int(meta.NumDelivered)
		}
		w.cfg.Hooks.HandedBack(e)
	}
}

// heartbeat keeps the message in progress and renews the job's lease until ctx ends.
func (d *delivery) heartbeat(ctx context.Context, id string) {
	w, log, msg, lease := d.w, d.log, d.msg, d.lease
	onTicks(ctx, w.cfg.Heartbeat, func() {
		_ = msg.InProgress()
		if !lease.held.Load() {
			return
		}
		held, err := w.cfg.Store.RenewLease(ctx, id, lease.Lease)
		switch {
		case err != nil && ctx.Err() == nil:
			log.WarnContext(ctx, "renew lease", slog.Any("error", err))
		case err == nil && !held && lease.held.Swap(false) && !lease.finishing.Load():
			// Terminal already (a cancel raced us), or our lease lapsed while
			// the store was away and a redelivery took over: first write wins.
			log.WarnContext(ctx, "lost the job's lease; another attempt may be running it")
		}
	})
}

func ptr[T any](v T) *T { return &v }
