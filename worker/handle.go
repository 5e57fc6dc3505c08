package worker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
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

	// Heartbeats keep the message ours, and the job's lease in the store
	// (see claim), for as long as we hold it.
	lease := &leaseState{Lease: cache.Lease{
		Token: fmt.Sprintf("%s/%d/%s", w.cfg.ID, attempt, rand.Text()[:10]), TTL: w.cfg.Queue.AckWait}}
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go w.heartbeat(hbCtx, log, msg, m.ID, lease)

	status, err := w.claimOrRestore(ectx, log, span, m, attempt, lease.Lease, &startedAt)
	for err == nil && status.Terminal() {
		// Acking drops the message, so the terminal state must first be
		// durable (durable.go). If a failover reverted it meanwhile, this
		// delivery claims the job again and runs it.
		var durable bool
		if durable, err = w.confirmTerminal(ectx, log, m.ID); err != nil || durable {
			break
		}
		log.WarnContext(ectx, "the job's terminal state was lost by the store; claiming the job again")
		status, err = w.claimOrRestore(ectx, log, span, m, attempt, lease.Lease, &startedAt)
	}
	switch {
	case errors.Is(err, cache.ErrNotFound):
		log.WarnContext(ectx, "job record missing and could not be restored; dropping message")
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
		if err := w.enqueueCallback(ectx, log, m, time.Now()); err != nil {
			_ = msg.NakWithDelay(retryDelay(attempt))
			return
		}
		_ = msg.DoubleAck(ectx)
		return
	}
	lease.held.Store(true)
	w.publishStatus(ectx, log, m.ID, job.StatusRunning)
	if attempt > 1 {
		// The attempt before this one may have left its sandbox running.
		w.announceRedelivery(ectx, log, m.ID)
	}
	queueWait = startedAt.Sub(m.CreatedAt)
	w.cfg.Metrics.QueueWait(ectx, m.Spec.Runtime, queueWait)
	if attempt > 1 {
		w.cfg.Metrics.Redelivered(ectx, m.Spec.Runtime)
	}

	runCtx, cancel := context.WithCancelCause(ectx)
	rj := &runningJob{cancel: cancel}
	w.mu.Lock()
	w.running[m.ID] = rj
	w.mu.Unlock()
	res, runErr := job.Result{}, error(nil)
	if m, runErr = w.loadSpec(runCtx, m); runErr == nil {
		res, runErr = w.runWithinQuota(runCtx, log, m)
	} else {
		res = job.Result{ID: m.ID, Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, runErr.Error())}
	}
	w.mu.Lock()
	delete(w.running, m.ID)
	w.mu.Unlock()
	forced := errors.Is(context.Cause(runCtx), errForcedDrain)
	cancel(nil)
	lease.finishing.Store(true)
	if cf := createFailure(nil); errors.As(runErr, &cf) && cf.SandboxCreateFailed() {
		w.cfg.Metrics.SandboxCreateFailed(ectx, m.Spec.Runtime)
	}

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
		if err := w.spillOutput(ectx, m, &r); err != nil {
			// Recording the result without its output would lose it: the
			// job runs again once the object store answers.
			log.WarnContext(ectx, "keep the job's output in the object store; handing the job back", slog.Any("error", err))
			w.handBack(ctx, log, msg, m.ID, lease, spillRetryDelay)
			return
		}
		if _, ok := w.record(ectx, log, m, r, false); !ok {
			w.handBack(ctx, log, msg, m.ID, lease, 0)
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
		w.handBack(ctx, log, msg, m.ID, lease, d.Delay)
	case actTerm:
		_ = msg.TermWithReason(d.Reason)
	}
}

// record writes a terminal result (first write wins) until the store
// confirms it durable (writeResult), fills the result cache, and tells
// waiters. won is whether r became the job's result; ok is false when the
// worker is stopping before the write was confirmed, or when the record's
// lifetime is over: the caller then hands the message back. With abandon, r
// is written only once no attempt holds a live lease on the job
// (Store.Abandon): record waits for the running attempt to finish or die.
func (w *Worker) record(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, abandon bool) (won, ok bool) {
	won, err := w.writeResult(ctx, log, m, r, abandon)
	if err != nil {
		log.WarnContext(ctx, "result not recorded durably; handing the job back", slog.Any("error", err))
		return false, false
	}
	w.settleCPU(ctx, log, m, r, won)
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
	w.notifyDone(ctx, log, m.ID, r.Status)
	w.publishEnd(ctx, log, r)
	if err := w.enqueueCallback(ctx, log, m, deref(r.FinishedAt, time.Now())); err != nil {
		return won, false
	}
	return won, true
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
			// Any answer, "not found" included, means the store is back: a
			// store that came back without the job's record must not leave
			// the worker paused for want of a write that succeeds.
			w.storeOK.Store(true)
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
	err := w.retryWhileLeased(ctx, log, func(c context.Context) error {
		if waited {
			*startedAt = time.Now()
		}
		var err error
		status, err = w.cfg.Store.MarkRunningLeased(c, id, w.cfg.ID, attempt, *startedAt, lease)
		return err
	}, func(err error) {
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

// retryWhileLeased runs op through retryStore, and again every leasePoll
// while it fails with cache.ErrLeased (another attempt is running the job),
// telling waiting (when set) each time.
func (w *Worker) retryWhileLeased(ctx context.Context, log *slog.Logger, op func(context.Context) error, waiting func(error)) error {
	for {
		err := w.retryStore(ctx, log, op)
		if !errors.Is(err, cache.ErrLeased) {
			return err
		}
		if waiting != nil {
			waiting(err)
		}
		if !sleep(ctx, w.leasePoll()) {
			return fmt.Errorf("waiting for the attempt holding the lease: %w", context.Cause(ctx))
		}
	}
}

// leasePoll is how often a held delivery asks whether the lease holder is
// done: often enough to take over soon after a lease (of AckWait) lapses.
func (w *Worker) leasePoll() time.Duration {
	return min(w.cfg.Heartbeat, w.cfg.Queue.AckWait/4, time.Second)
}

// handBack releases the job's lease and naks the message, so that its
// redelivery can start at once instead of waiting for the lease to lapse.
func (w *Worker) handBack(ctx context.Context, log *slog.Logger, msg jetstream.Msg, id string, lease *leaseState, delay time.Duration) {
	if lease.held.Swap(false) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if _, err := w.cfg.Store.ReleaseLease(rctx, id, lease.Token); err != nil {
			log.WarnContext(ctx, "release lease; the redelivery waits for it to lapse", slog.Any("error", err))
		}
		cancel()
	}
	_ = msg.NakWithDelay(delay)
}

// heartbeat keeps the message in progress and renews the job's lease until ctx ends.
func (w *Worker) heartbeat(ctx context.Context, log *slog.Logger, msg jetstream.Msg, id string, lease *leaseState) {
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
