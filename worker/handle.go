package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// record writes a terminal result (first write wins) until the store
// confirms it durable (writeResult), fills the result cache, and tells
// waiters. won is whether r became the job's result; ok is false when the
// worker is stopping before the write was confirmed, or when the record's
// lifetime is over: the caller then hands the message back. With abandon, r
// is written only once no attempt holds a live lease on the job
// (Store.Abandon): record waits for the running attempt to finish or die.
func (w *Worker) record(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, abandon bool, a *runAudit) (won, ok bool) {
	won, err := w.writeResult(ctx, log, m, r, abandon)
	if err != nil {
		log.WarnContext(ctx, "result not recorded durably; handing the job back", slog.Any("error", err))
		return false, false
	}
	fire(w.cfg.Hooks.Recorded, Event{JobID: m.ID, Attempt: r.Attempt, Status: r.Status, Won: won})
	w.settleCPU(ctx, log, m, r, won)
	w.settleBudget(ctx, log, m, r, won)
	if !won {
		log.InfoContext(ctx, "a terminal result was already recorded; keeping it")
	} else if m.Spec.CacheEnabled() && r.Cacheable() {
		// Keyed by the digest that actually ran, so a new image never answers for an old one.
		key := m.CacheKey(r.Image.Digest)
		sctx, span := w.tracer.Start(ctx, ktrace.SpanCacheStore, trace.WithAttributes(
			ktrace.JobIDKey.String(m.ID), ktrace.CacheKeyKey.String(key)))
		if err := w.cfg.Store.StoreResult(sctx, key, r); err != nil {
			span.SetStatus(codes.Error, err.Error())
			log.WarnContext(ctx, "store result in cache", slog.Any("error", err))
		}
		span.End()
	}
	if a == nil {
		a = w.audit.newRun(log, m.ID, m.TenantOrDefault(), m.Quota, nil)
	}
	if won {
		a.add(resultRecord(m, r), resultMsgID(m.ID))
	}
	// The run's audit records are stored before the job is acked (or
	// handed back when the worker stops first: its redelivery appends
	// the result's).
	if err := a.flush(ctx); err != nil {
		return won, false
	}
	w.notifyDone(ctx, log, m.ID, r.Status)
	w.publishEnd(ctx, log, r)
	if err := w.enqueueCallback(ctx, log, m, deref(r.FinishedAt, w.cfg.Clock.Now())); err != nil {
		return won, false
	}
	return won, true
}

func (w *Worker) notifyDone(ctx context.Context, log *slog.Logger, id string, st job.Status) {
	b, _ := json.Marshal(job.DoneNotice{ID: id, Status: st})
	if err := w.cfg.NATS.Publish(job.DoneSubject(id), b); err != nil {
		// Waiters fall back to their own timeout and read the record.
		log.WarnContext(ctx, "publish completion notice", slog.Any("error", err))
	}
}

// leaseState is this delivery's lease on the job. The token is unique to
// the delivery, so two deliveries of the same job never share a lease, even
// on one worker.
type leaseState struct {
	cache.Lease
	held      atomic.Bool // set once claim got the job; cleared when the lease is given up or lost
	finishing atomic.Bool // the run is over: the job turning terminal under us is expected
}

// claim marks the job running under a lease of AckWait. While another attempt
// holds a live lease (the queue redelivered the job because it lost that
// worker's heartbeats, not because the worker died), it holds this delivery,
// kept alive by the heartbeat, and asks again until the job is terminal
// (the caller acks) or the lease lapses (this attempt takes over). *startedAt
// moves to the moment the job was taken.
func (w *Worker) claim(ctx context.Context, log *slog.Logger, span trace.Span, id string, attempt int, lease cache.Lease, startedAt *time.Time) (job.Status, error) {
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
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = msg.InProgress()
		if !lease.held.Load() {
			continue
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
	}
}

func ptr[T any](v T) *T { return &v }
