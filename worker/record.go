package worker

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// recorder records what a job came to: its terminal result, written until
// the store holds it durably (durable.go), the tenant's CPU quota and the
// job's budget settled (cpuquota.go, budget.go), the result cache filled,
// the audit records stored, waiters told, and the callback queued
// (callback.go). A delivery records through it, and so does the give-up of
// a job whose deliveries ran out (advisory.go).
type recorder struct {
	store   Store
	sw      *storeWatch
	audit   *auditLog
	nc      *nats.Conn
	js      jetstream.JetStream
	queue   queue.Config // the callback stream's settings, should no API have made it
	clock   Clock
	tracer  trace.Tracer
	hooks   Hooks
	metrics *ktrace.Metrics
}

// record writes a terminal result (first write wins) until the store
// confirms it durable (writeResult), fills the result cache, and tells
// waiters. won is whether r became the job's result; ok is false when the
// worker is stopping before the write was confirmed, or when the record's
// lifetime is over: the caller then hands the message back. With abandon, r
// is written only once no attempt holds a live lease on the job
// (Store.Abandon): record waits for the running attempt to finish or die.
func (rc *recorder) record(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, abandon bool, a *runAudit) (won, ok bool) {
	won, err := rc.writeResult(ctx, log, m, r, abandon)
	if err != nil {
		log.WarnContext(ctx, "result not recorded durably; handing the job back", slog.Any("error", err))
		return false, false
	}
	fire(rc.hooks.Recorded, Event{JobID: m.ID, Attempt: r.Attempt, Status: r.Status, Won: won})
	rc.settleCPU(ctx, log, m, r, won)
	rc.settleBudget(ctx, log, m, r, won)
	if !won {
		log.InfoContext(ctx, "a terminal result was already recorded; keeping it")
	} else if m.Spec.CacheEnabled() && r.Cacheable() {
		// Keyed by the digest that actually ran, so a new image never answers for an old one.
		key := m.CacheKey(r.Image.Digest)
		sctx, span := rc.tracer.Start(ctx, ktrace.SpanCacheStore, trace.WithAttributes(
			ktrace.JobIDKey.String(m.ID), ktrace.CacheKeyKey.String(key)))
		if err := rc.store.StoreResult(sctx, key, r); err != nil {
			span.SetStatus(codes.Error, err.Error())
			log.WarnContext(ctx, "store result in cache", slog.Any("error", err))
		}
		span.End()
	}
	if a == nil {
		a = rc.audit.newRun(log, m.ID, m.TenantOrDefault(), m.Quota, nil)
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
	rc.notifyDone(ctx, log, m.ID, r.Status)
	rc.publishEnd(ctx, log, r)
	if err := rc.enqueueCallback(ctx, log, m, deref(r.FinishedAt, rc.clock.Now())); err != nil {
		return won, false
	}
	return won, true
}

// notifyDone tells the job's waiters (long-polls) that it ended.
func (rc *recorder) notifyDone(ctx context.Context, log *slog.Logger, id string, st job.Status) {
	b, _ := json.Marshal(job.DoneNotice{ID: id, Status: st})
	if err := rc.nc.Publish(job.DoneSubject(id), b); err != nil {
		// Waiters fall back to their own timeout and read the record.
		log.WarnContext(ctx, "publish completion notice", slog.Any("error", err))
	}
}

// publishEnd sends the job's end events (terminal status, artifacts, result marker).
func (rc *recorder) publishEnd(ctx context.Context, log *slog.Logger, r job.Result) {
	if err := events.End(rc.nc, r.ID, r); err != nil {
		log.WarnContext(ctx, "publish end events", slog.Any("error", err))
	}
}
