package worker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
	ktrace "github.com/kilnrun/kiln/trace"
)

// errPanicked is the run error of a job whose handling panicked. The panic
// and its stack are in the worker's log; the job's result says only this,
// and the job is retried like any other platform failure.
var errPanicked = errors.New("the worker failed while handling this job (a panic, logged with its stack)")

// delivery is one JetStream delivery of a job, carried from claim to ack
// (claim → run → record → ack). Its heartbeat is a goroutine it owns and
// waits for; a panic anywhere in it fails this job alone, retryably.
type delivery struct {
	w         *Worker
	msg       jetstream.Msg
	m         job.Message
	attempt   int
	log       *slog.Logger
	span      trace.Span // the execute span
	lease     *leaseState
	startedAt time.Time
	queueWait time.Duration
	red       *redact.Detector // the tenant's redaction, once the run made it
	audit     *runAudit        // the run's audit records, once the run made it
	ran       bool             // the sandbox ran the job and judged its ending
}

// handle runs one delivery to its ack, nak or term. ctx is the worker's hard
// context: it ends only when the drain grace period is over.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.ErrorContext(ctx, "message without metadata; terminating", slog.Any("error", err))
		_ = msg.TermWithReason("no metadata")
		return
	}
	var m job.Message
	if err := json.Unmarshal(msg.Data(), &m); err != nil || !job.ValidID(m.ID) {
		w.log.ErrorContext(ctx, "undecodable job message; terminating", slog.Any("error", err), slog.Uint64("stream_seq", meta.Sequence.Stream))
		_ = msg.TermWithReason("undecodable job message")
		return
	}
	attempt := int(meta.NumDelivered)
	d := &delivery{w: w, msg: msg, m: m, attempt: attempt,
		log: w.log.With(slog.String("job_id", m.ID), slog.Int("attempt", attempt))}
	fire(w.cfg.Hooks.Delivered, d.event())
	d.execute(ctx, queuedAt(msg, meta))
}

// queuedAt is when a job's message was first stored: in its tenant's
// backlog, as its ready message says, else (a message of an earlier
// version) when its own message was.
func queuedAt(msg jetstream.Msg, meta *jetstream.MsgMetadata) time.Time {
	if at, err := time.Parse(time.RFC3339Nano, msg.Headers().Get(job.HeaderQueuedAt)); err == nil {
		return at
	}
	return meta.Timestamp
}

// execute traces the delivery, keeps it alive with heartbeats, and runs its
// steps. queuedAt is when the message was stored.
func (d *delivery) execute(ctx context.Context, queuedAt time.Time) {
	w, m := d.w, d.m
	// One trace per job: every attempt continues the context the producer sent.
	pctx := ktrace.Extract(ctx, w.cfg.Propagator, d.msg.Headers())
	d.startedAt = w.cfg.Clock.Now()
	d.queueWait = d.startedAt.Sub(m.CreatedAt)
	_, qspan := w.tracer.Start(pctx, ktrace.SpanQueue, trace.WithTimestamp(queuedAt),
		trace.WithAttributes(ktrace.JobIDKey.String(m.ID), ktrace.AttemptKey.Int(d.attempt),
			ktrace.QueueWaitMSKey.Int64(d.queueWait.Milliseconds())))
	qspan.End(trace.WithTimestamp(d.startedAt))
	attrs := append([]attribute.KeyValue{
		ktrace.JobIDKey.String(m.ID), ktrace.AttemptKey.Int(d.attempt),
		ktrace.RuntimeKey.String(m.Spec.Runtime), ktrace.WorkerIDKey.String(w.cfg.ID), ktrace.HostNameKey.String(w.host),
		ktrace.CodeSHA256Key.String(job.CodeSHA256(m.Spec.Code)), ktrace.CacheKeyKey.String(m.Key),
	}, ktrace.LimitAttrs(m.Spec.Limits)...)
	ectx, span := w.tracer.Start(trace.ContextWithSpan(pctx, qspan), ktrace.SpanExecute,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	defer span.End()
	d.span = span
	d.log = d.log.With(slog.String("trace_id", span.SpanContext().TraceID().String()))

	// Heartbeats keep the message ours, and the job's lease in the store
	// (see claim), for as long as we hold it.
	d.lease = &leaseState{Lease: cache.Lease{
		Token: fmt.Sprintf("%s/%d/%s", w.cfg.ID, d.attempt, rand.Text()[:10]), TTL: w.cfg.Queue.AckWait}}
	hbCtx, stopHB := context.WithCancel(ctx)
	var bg errgroup.Group
	id := m.ID // run replaces d.m (a spilled spec read back) while the heartbeats go on
	bg.Go(func() error { d.heartbeat(hbCtx, id); return nil })
	defer func() { stopHB(); _ = bg.Wait() }()
	defer func() {
		// A panic outside the run (claiming, recording) hands the job back:
		// its next delivery starts over, and the deliveries' bound still
		// ends it as internal_error.
		if p := recover(); p != nil {
			d.panicked(ectx, p)
			d.span.SetStatus(codes.Error, errPanicked.Error())
			d.handBack(ectx, retryDelay(d.attempt))
		}
	}()

	if !d.claim(ectx) {
		return
	}
	out := d.run(ectx)
	dec := decide(out)
	d.log.InfoContext(ectx, "job run", slog.String("decision", dec.Act.String()), slog.String("reason", dec.Reason),
		slog.String("status", string(out.Result.Status)), slog.Int64("wall_ms", out.Result.WallMS))
	if !d.record(ectx, dec) {
		return
	}
	d.ack(ectx, dec)
}

// claim takes the job for this delivery. false: the delivery was settled
// (the job was terminal already, its record is gone, or the worker is
// stopping) and there is nothing to run.
func (d *delivery) claim(ctx context.Context) bool {
	w, log := d.w, d.log
	status, err := d.claimOrRestore(ctx)
	for err == nil && status.Terminal() {
		// Acking drops the message, so the terminal state must first be
		// durable (durable.go). If a failover reverted it meanwhile, this
		// delivery claims the job again and runs it.
		var durable bool
		if durable, err = d.confirmTerminal(ctx); err != nil || durable {
			break
		}
		log.WarnContext(ctx, "the job's terminal state was lost by the store; claiming the job again")
		status, err = d.claimOrRestore(ctx)
	}
	switch {
	case errors.Is(err, cache.ErrNotFound):
		log.WarnContext(ctx, "job record missing and could not be restored; dropping message")
		d.span.SetStatus(codes.Error, "job record missing")
		_ = d.msg.TermWithReason("job record missing")
		fire(w.cfg.Hooks.Terminated, d.event())
		return false
	case err != nil:
		// Only a dying worker gets here (the retry ends with ctx): hand the job back.
		_ = d.msg.Nak()
		fire(w.cfg.Hooks.HandedBack, d.event())
		return false
	case status.Terminal():
		log.InfoContext(ctx, "job already terminal; acking", slog.String("status", string(status)))
		d.span.SetAttributes(ktrace.StatusKey.String(string(status)))
		// The attempt that recorded the result may have stopped before its
		// audit records were stored: its result's, at least, is appended
		// (once: the stream drops a duplicate within its window).
		if err := d.auditStoredResult(ctx); err != nil {
			_ = d.msg.NakWithDelay(retryDelay(d.attempt))
			fire(w.cfg.Hooks.HandedBack, d.event())
			return false
		}
		if err := w.results.enqueueCallback(ctx, log, d.m, w.cfg.Clock.Now()); err != nil {
			_ = d.msg.NakWithDelay(retryDelay(d.attempt))
			fire(w.cfg.Hooks.HandedBack, d.event())
			return false
		}
		if err := d.msg.DoubleAck(ctx); err == nil {
			fire(w.cfg.Hooks.Acked, d.event())
		}
		return false
	}
	d.lease.held.Store(true)
	d.publishStatus(ctx, job.StatusRunning)
	if d.attempt > 1 {
		// The attempt before this one may have left its sandbox running.
		d.announceRedelivery(ctx)
	}
	d.queueWait = d.startedAt.Sub(d.m.CreatedAt)
	w.cfg.Metrics.QueueWait(ctx, d.m.Spec.Runtime, d.queueWait)
	if d.attempt > 1 {
		w.cfg.Metrics.Redelivered(ctx, d.m.Spec.Runtime)
	}
	fire(w.cfg.Hooks.Claimed, d.event())
	return true
}

// run runs the job in the sandbox runtime, cancellable by its client. A
// panic while it runs is its run error (errPanicked).
func (d *delivery) run(ctx context.Context) (out runEnd) {
	w := d.w
	out.Attempt, out.MaxDeliver = d.attempt, w.cfg.Queue.MaxDeliver
	runCtx, cancel := context.WithCancelCause(ctx)
	rj := w.cancels.startJob(d.m.ID, cancel)
	defer func() {
		if p := recover(); p != nil {
			d.panicked(ctx, p)
			out.Result, out.Err = job.Result{}, errPanicked
		}
		w.cancels.endJob(d.m.ID)
		out.ForcedDrain = errors.Is(context.Cause(runCtx), errForcedDrain)
		out.UserCancel = rj.userCancel.Load()
		cancel(nil)
		d.lease.finishing.Store(true)
		if cf := createFailure(nil); errors.As(out.Err, &cf) && cf.SandboxCreateFailed() {
			w.cfg.Metrics.SandboxCreateFailed(ctx, d.m.Spec.Runtime)
		}
	}()
	m, err := w.objects.loadSpec(runCtx, d.m)
	if err != nil {
		out.Result = job.Result{ID: d.m.ID, Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, err.Error())}
		return out
	}
	d.m = m
	// The tenant's daily CPU quota is reserved as the run starts
	// (cpuquota.go) and settled when its result is recorded.
	if res, err := d.cpuReserve(runCtx); err != nil || res != nil {
		if res != nil {
			out.Result = *res
		} else {
			out.Err = err
		}
		return out
	}
	// The budget the job names, likewise (budget.go).
	if res, err := d.budgetReserve(runCtx); err != nil || res != nil {
		if res != nil {
			out.Result = *res
		} else {
			out.Err = err
		}
		return out
	}
	var refusal storedRefusal
	d.red = detector(runCtx, d.log, m.Redact)
	d.audit = w.audit.newRun(d.log, m.ID, m.TenantOrDefault(), m.Quota, d.red)
	req, output := d.runRequest(runCtx, &refusal)
	defer output.Close() // idempotent: a panicking run must not leak its output goroutine
	for {
		out.Result, out.Err = w.cfg.Runtime.Run(runCtx, req)
		if out.Err == nil || !d.holdForBackend(runCtx, out.Err) {
			break
		}
	}
	output.Close()
	if out.Err == nil {
		d.ran = true
		failStored(&out.Result, &refusal)
	}
	return out
}

// record writes the decision's terminal result, if it has one. false: the
// write could not be made durable and the job was handed back.
func (d *delivery) record(ctx context.Context, dec decision) bool {
	if dec.Write == nil {
		return true
	}
	w, m := d.w, d.m
	finishedAt := w.cfg.Clock.Now()
	r := *dec.Write
	// The one point where a delivery's result leaves the worker: every
	// string of it is redacted here, before it is stored, cached, streamed,
	// called back, audited or compared with what it replays.
	if d.red == nil {
		d.red = detector(ctx, d.log, m.Redact)
	}
	d.red.Result(&r)
	if d.ran {
		d.compareReplay(ctx, &r)
	}
	r.ID, r.Attempt, r.Worker, r.TraceID = m.ID, d.attempt, w.cfg.ID, d.span.SpanContext().TraceID().String()
	r.QueueMS = d.queueWait.Milliseconds()
	r.CreatedAt, r.StartedAt, r.FinishedAt = ptr(m.CreatedAt), ptr(d.startedAt), ptr(finishedAt)
	if err := w.objects.spill(ctx, m, &r); err != nil {
		// Recording the result without its output would lose it: the
		// job runs again once the object store answers.
		d.log.WarnContext(ctx, "keep the job's output in the object store; handing the job back", slog.Any("error", err))
		d.handBack(ctx, spillRetryDelay)
		return false
	}
	if d.audit == nil {
		d.audit = w.audit.newRun(d.log, m.ID, m.TenantOrDefault(), m.Quota, d.red)
	}
	if _, ok := w.results.record(ctx, d.log, m, r, false, d.audit); !ok {
		d.handBack(ctx, 0)
		return false
	}
	traceOutcome(d.span, r)
	w.cfg.Metrics.JobFinished(ctx, m.Spec.Runtime, string(r.Status), finishedAt.Sub(d.startedAt), finishedAt.Sub(m.CreatedAt))
	switch r.Status {
	case job.StatusOOMKilled:
		w.cfg.Metrics.OOMKilled(ctx, m.Spec.Runtime)
	case job.StatusTimedOut:
		w.cfg.Metrics.TimedOut(ctx, m.Spec.Runtime)
	}
	return true
}

// ack settles the message as the decision says.
func (d *delivery) ack(ctx context.Context, dec decision) {
	switch dec.Act {
	case actAck:
		if err := d.msg.DoubleAck(ctx); err != nil {
			// The result is recorded; a redelivery will find it terminal and ack.
			d.log.WarnContext(ctx, "ack", slog.Any("error", err))
			return
		}
		fire(d.w.cfg.Hooks.Acked, d.event())
	case actNak:
		d.span.SetStatus(codes.Error, dec.Reason)
		d.handBack(ctx, dec.Delay)
	case actTerm:
		_ = d.msg.TermWithReason(dec.Reason)
		fire(d.w.cfg.Hooks.Terminated, d.event())
	}
}

// event names this delivery to a hook.
func (d *delivery) event() Event { return Event{JobID: d.m.ID, Attempt: d.attempt} }

// panicked logs a recovered panic with its stack.
func (d *delivery) panicked(ctx context.Context, p any) {
	d.log.ErrorContext(ctx, "panic while handling a job; failing this job alone",
		slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
}

// traceOutcome puts what a run came to on its execute span (a job's or a
// session call's): its status and exit code, and for a run that did not
// succeed its error category and span status Error.
func traceOutcome(span trace.Span, r job.Result) {
	span.SetAttributes(ktrace.StatusKey.String(string(r.Status)))
	if r.ExitCode != nil {
		span.SetAttributes(ktrace.ExitCodeKey.Int(*r.ExitCode))
	}
	if r.Error != nil {
		span.SetAttributes(ktrace.ErrorCategoryKey.String(string(r.Error.Category)))
		span.SetStatus(codes.Error, string(r.Error.Category))
	}
}
