package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// handle runs one delivery to its ack, nak or term. ctx is the worker's hard
// context: it ends only when the drain grace period is over.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.ErrorContext(ctx, "message without metadata; terminating", slog.Any("error", err))
		_ = msg.TermWithReason("no metadata")
		return
	}
	attempt := int(meta.NumDelivered)
	var m job.Message
	if err := json.Unmarshal(msg.Data(), &m); err != nil || !job.ValidID(m.ID) {
		w.log.ErrorContext(ctx, "undecodable job message; terminating", slog.Any("error", err), slog.Uint64("stream_seq", meta.Sequence.Stream))
		_ = msg.TermWithReason("undecodable job message")
		return
	}
	log := w.log.With(slog.String("job_id", m.ID), slog.Int("attempt", attempt))

	// One trace per job: every attempt continues the context the producer sent.
	pctx := ktrace.Extract(ctx, w.cfg.Propagator, msg.Headers())
	startedAt := time.Now()
	queueWait := startedAt.Sub(m.CreatedAt)
	_, qspan := w.tracer.Start(pctx, ktrace.SpanQueue, trace.WithTimestamp(meta.Timestamp),
		trace.WithAttributes(ktrace.JobIDKey.String(m.ID), ktrace.AttemptKey.Int(attempt),
			ktrace.QueueWaitMSKey.Int64(queueWait.Milliseconds())))
	qspan.End(trace.WithTimestamp(startedAt))
	attrs := append([]attribute.KeyValue{
		ktrace.JobIDKey.String(m.ID), ktrace.AttemptKey.Int(attempt),
		ktrace.RuntimeKey.String(m.Spec.Runtime), ktrace.WorkerIDKey.String(w.cfg.ID), ktrace.HostNameKey.String(w.host),
		ktrace.CodeSHA256Key.String(job.CodeSHA256(m.Spec.Code)), ktrace.CacheKeyKey.String(m.Key),
	}, ktrace.LimitAttrs(m.Spec.Limits)...)
	ectx, span := w.tracer.Start(trace.ContextWithSpan(pctx, qspan), ktrace.SpanExecute,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	defer span.End()
	log = log.With(slog.String("trace_id", span.SpanContext().TraceID().String()))

	// Heartbeats keep the message ours for as long as we hold it.
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go w.heartbeat(hbCtx, msg)

	var status job.Status
	err = w.retryStore(ectx, log, func(c context.Context) error {
		var err error
		status, err = w.cfg.Store.MarkRunning(c, m.ID, w.cfg.ID, attempt, startedAt)
		return err
	})
	switch {
	case errors.Is(err, cache.ErrNotFound):
		// The record expired or the producer rolled it back: nobody can read a result.
		log.WarnContext(ectx, "job record missing; dropping message")
		span.SetStatus(codes.Error, "job record missing")
		_ = msg.TermWithReason("job record missing")
		return
	case err != nil:
		// Only a dying worker gets here (the retry ends with ctx): hand the job back.
		_ = msg.Nak()
		return
	case status.Terminal():
		log.InfoContext(ectx, "job already terminal; acking", slog.String("status", string(status)))
		span.SetAttributes(ktrace.StatusKey.String(string(status)))
		_ = msg.DoubleAck(ectx)
		return
	}
	w.cfg.Metrics.QueueWait(ectx, m.Spec.Runtime, queueWait)
	if attempt > 1 {
		w.cfg.Metrics.Redelivered(ectx, m.Spec.Runtime)
	}

	runCtx, cancel := context.WithCancelCause(ectx)
	rj := &runningJob{cancel: cancel}
	w.mu.Lock()
	w.running[m.ID] = rj
	w.mu.Unlock()
	res, runErr := w.cfg.Runtime.Run(runCtx, m.ID, m.Spec)
	w.mu.Lock()
	delete(w.running, m.ID)
	w.mu.Unlock()
	forced := errors.Is(context.Cause(runCtx), errForcedDrain)
	cancel(nil)

	d := decide(runOutcome{
		Result: res, Err: runErr, Attempt: attempt, MaxDeliver: w.cfg.Queue.MaxDeliver,
		UserCancel: rj.userCancel.Load(), ForcedDrain: forced,
	})
	log.InfoContext(ectx, "job run", slog.String("decision", d.Act.String()), slog.String("reason", d.Reason),
		slog.String("status", string(res.Status)), slog.Int64("wall_ms", res.WallMS))
	finishedAt := time.Now()
	if d.Write != nil {
		r := *d.Write
		r.ID, r.Attempt, r.Worker, r.TraceID = m.ID, attempt, w.cfg.ID, span.SpanContext().TraceID().String()
		r.QueueMS = queueWait.Milliseconds()
		r.CreatedAt, r.StartedAt, r.FinishedAt = ptr(m.CreatedAt), ptr(startedAt), ptr(finishedAt)
		if !w.record(ectx, log, m, r) {
			_ = msg.Nak()
			return
		}
		span.SetAttributes(ktrace.StatusKey.String(string(r.Status)))
		if r.ExitCode != nil {
			span.SetAttributes(ktrace.ExitCodeKey.Int(*r.ExitCode))
		}
		if r.Error != nil {
			span.SetAttributes(ktrace.ErrorCategoryKey.String(string(r.Error.Category)))
			span.SetStatus(codes.Error, string(r.Error.Category))
		}
		w.cfg.Metrics.JobFinished(ectx, m.Spec.Runtime, string(r.Status), finishedAt.Sub(startedAt), finishedAt.Sub(m.CreatedAt))
		switch r.Status {
		case job.StatusOOMKilled:
			w.cfg.Metrics.OOMKilled(ectx, m.Spec.Runtime)
		case job.StatusTimedOut:
			w.cfg.Metrics.TimedOut(ectx, m.Spec.Runtime)
		}
	}
	switch d.Act {
	case actAck:
		if err := msg.DoubleAck(ectx); err != nil {
			// The result is recorded; a redelivery will find it terminal and ack.
			log.WarnContext(ectx, "ack", slog.Any("error", err))
		}
	case actNak:
		span.SetStatus(codes.Error, d.Reason)
		_ = msg.NakWithDelay(d.Delay)
	case actTerm:
		_ = msg.TermWithReason(d.Reason)
	}
}

// record writes a terminal result (first write wins), fills the result cache,
// and tells waiters. It reports false only when the worker is dying before
// the store came back.
func (w *Worker) record(ctx context.Context, log *slog.Logger, m job.Message, r job.Result) bool {
	var won bool
	err := w.retryStore(ctx, log, func(c context.Context) error {
		var err error
		won, err = w.cfg.Store.Finish(c, m.ID, r)
		return err
	})
	if err != nil {
		return false
	}
	if !won {
		log.InfoContext(ctx, "a terminal result was already recorded; keeping it")
	} else if m.Spec.CacheEnabled() && r.Cacheable() {
		// Keyed by the digest that actually ran, so a new image never answers for an old one.
		key := job.Key(m.Spec, r.Image.Digest)
		if err := w.cfg.Store.StoreResult(ctx, key, r); err != nil {
			log.WarnContext(ctx, "store result in cache", slog.Any("error", err))
		}
	}
	w.notifyDone(ctx, log, m.ID, r.Status)
	return true
}

type doneNotice struct {
	ID     string     `json:"id"`
	Status job.Status `json:"status"`
}

func (w *Worker) notifyDone(ctx context.Context, log *slog.Logger, id string, st job.Status) {
	b, _ := json.Marshal(doneNotice{ID: id, Status: st})
	if err := w.cfg.NATS.Publish(job.DoneSubject(id), b); err != nil {
		// Waiters fall back to their own timeout and read the record.
		log.WarnContext(ctx, "publish completion notice", slog.Any("error", err))
	}
}

// retryStore runs op until it succeeds, fails for a reason other than the
// store being unreachable, or ctx ends. While the store is down the worker
// pulls no new jobs; the message is kept alive by the heartbeat.
func (w *Worker) retryStore(ctx context.Context, log *slog.Logger, op func(context.Context) error) error {
	delay := 100 * time.Millisecond
	for {
		err := op(ctx)
		if !errors.Is(err, cache.ErrUnavailable) {
			if err == nil {
				w.storeOK.Store(true)
			}
			return err
		}
		if w.storeOK.Swap(false) {
			log.WarnContext(ctx, "store unavailable; holding job and pausing pulls", slog.Any("error", err))
		}
		if !sleep(ctx, delay) {
			return fmt.Errorf("store unavailable and worker stopping: %w", err)
		}
		delay = min(delay*2, 3*time.Second)
	}
}

func (w *Worker) heartbeat(ctx context.Context, msg jetstream.Msg) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}

func ptr[T any](v T) *T { return &v }
