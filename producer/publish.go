package producer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// An acknowledged submission must always run, and a 503 must never hide a
// job that will run anyway without the client being able to tell. So a
// publish has three outcomes here:
//
//   - confirmed: JetStream acknowledged it; the record is marked published.
//   - refused: the server said no (stream full) or the request never left
//     (no connection, no responders): nothing was queued, the record is
//     rolled back, the client gets 429/503 "nothing was queued".
//   - unconfirmed: the request was sent but no answer came in time: the
//     message may be stored. The record stays, queued and unpublished; the
//     client gets 503 naming the job id ("outcome unknown"), a retry with
//     the same Idempotency-Key republishes it (JetStream's duplicate window
//     with Nats-Msg-Id = job id makes that safe), and the reconciler
//     republishes what nobody retried. Either way the job runs exactly once.

// jobQueue is the API's side of the job queue: it sets up the job stream
// (stream.go) and says whether it is (queueCheck, for /readyz), publishes
// jobs with the outcomes above, and feeds the queue gauges (queuedepth.go).
type jobQueue struct {
	cfg     *Config // Queue, Events, Tenants' max_running, PublishTimeout
	store   Store
	nc      *nats.Conn
	js      jetstream.JetStream
	blobs   *blob.Store // the object store, set up with the stream; specs by reference
	prop    propagation.TextMapPropagator
	log     *slog.Logger
	metrics *ktrace.Metrics
	// bg is the Server's background group, which runs the stream's set-up
	// retries and the gauges' poll.
	bg *errgroup.Group
	// jobs is the job stream once looked up (jobStream).
	jobs atomic.Pointer[jetstream.Stream]
	// state is "ok" once the job stream is set up, else what is wrong.
	state atomic.Pointer[string]
}

// publishRecorded publishes a job whose record exists, with the outcomes above.
func (q *jobQueue) publishRecorded(ctx context.Context, msg job.Message) error {
	err := q.publishConfirmed(ctx, msg)
	if err == nil || errors.Is(err, errPublishUnconfirmed) {
		return err
	}
	q.rollback(ctx, msg)
	q.forgetUnpublished(ctx, msg.ID)
	return err
}

// publishConfirmed publishes msg and, once JetStream acknowledged it, marks
// the record published. A failure to mark is only logged: the reconciler's
// republish of a published job is a duplicate JetStream drops (within the
// window) or a worker acks at once (the job is terminal by then).
func (q *jobQueue) publishConfirmed(ctx context.Context, msg job.Message) error {
	if err := q.publish(ctx, msg); err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := q.store.MarkPublished(mctx, msg.ID); err != nil {
		q.log.WarnContext(ctx, "mark job published", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
	return nil
}

// ensurePublished republishes a queued job whose publish was never
// confirmed (an idempotent replay after a timeout or a crash).
func (q *jobQueue) ensurePublished(ctx context.Context, rec *cache.Record) error {
	if rec.Status != job.StatusQueued || rec.Published || rec.CacheHit {
		return nil
	}
	if err := q.publishConfirmed(ctx, rec.Message); err != nil {
		var r *refusal
		if errors.As(err, &r) {
			// Refused: nothing was queued this time either, and the record
			// stays for the reconciler or the client's next retry.
			r.recorded = rec.Message.ID
		}
		return err
	}
	q.metrics.JobRepublished(ctx, rec.Message.Spec.Runtime)
	q.log.InfoContext(ctx, "republished a job whose publish was never confirmed", slog.String("job_id", rec.Message.ID))
	return nil
}

// publishUnconfirmed is errPublishUnconfirmed for job id, logged.
func (q *jobQueue) publishUnconfirmed(ctx context.Context, id string, err error) error {
	q.log.WarnContext(ctx, "publish job unconfirmed", slog.String("job_id", id), slog.Any("error", err))
	return &refusal{kind: errPublishUnconfirmed, recorded: id, cause: err}
}

func (q *jobQueue) forgetUnpublished(ctx context.Context, id string) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := q.store.ForgetUnpublished(fctx, id); err != nil {
		q.log.WarnContext(ctx, "forget unpublished job", slog.String("job_id", id), slog.Any("error", err))
	}
}

// recordCacheHit stores the cache-hit answer under its id, so a later GET
// finds it. A failure is logged: the answer itself is already complete.
func (q *jobQueue) recordCacheHit(ctx context.Context, msg job.Message, res job.Result) {
	if err := q.store.CreateAlias(ctx, msg, res); err != nil {
		q.log.WarnContext(ctx, "record cache hit; a later GET of this id answers 404", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
}

// sendJob publishes m until JetStream answers or ctx ends. "No responders"
// (no server has the stream right now: a restart, a leader election) is
// retried here rather than by the client library, so that when ctx ends on
// it the error still says no server took the message, which
// queue.PublishMayHaveStored reads as a definite "nothing was queued".
func (q *jobQueue) sendJob(ctx context.Context, m *nats.Msg) error {
	var noOne error // the last "no server has the stream" answer
	for {
		_, err := q.js.PublishMsg(ctx, m, jetstream.WithExpectStream(job.StreamName), jetstream.WithRetryAttempts(0))
		if noOne != nil && ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			// ctx ended during a retry of a publish no server took: still
			// the definite answer, not an unconfirmed one.
			return noOne
		}
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		noOne = err
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// publish sends the job to JetStream with Nats-Msg-Id = id and the trace
// context in the headers, within PublishTimeout. It refuses with
// errQueueFull when the stream is full, errQueueUnavailable when NATS cannot
// take the job, errPublishUnconfirmed when it may have been stored.
func (q *jobQueue) publish(ctx context.Context, msg job.Message) error {
	if !q.nc.IsConnected() {
		return q.queueUnavailable(ctx, msg.ID, fmt.Errorf("nats connection is %s", q.nc.Status()))
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode job message: %w", err)
	}
	tenant := msg.TenantOrDefault()
	subject := job.TenantJobSubject(msg.Spec.Runtime, tenant)
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(job.HeaderMsgID, msg.ID)
	m.Header.Set(job.HeaderJobID, msg.ID)
	if n := q.cfg.Tenants[tenant].Quota.MaxRunning; n > 0 {
		// The workers hold the tenant to it as they take its jobs.
		m.Header.Set(job.HeaderMaxRunning, strconv.FormatInt(n, 10))
	}
	ktrace.Inject(ctx, q.prop, m.Header)
	pctx, cancel := context.WithTimeout(ctx, q.cfg.PublishTimeout)
	defer cancel()
	if err := q.sendJob(pctx, m); err != nil {
		if queue.PublishMayHaveStored(err) {
			return q.publishUnconfirmed(ctx, msg.ID, err)
		}
		if queue.IsStreamFull(err) {
			q.log.WarnContext(ctx, "job queue full", slog.String("job_id", msg.ID))
			return &refusal{kind: errQueueFull, cause: err}
		}
		return q.queueUnavailable(ctx, msg.ID, err)
	}
	// Wake idle workers, naming the subject that holds the job; a lost
	// wake-up only delays the job to their next poll.
	_ = q.nc.Publish(job.WorkSubject(msg.Spec.Runtime), []byte(subject))
	return nil
}

// queueUnavailable is errQueueUnavailable for job id, logged.
func (q *jobQueue) queueUnavailable(ctx context.Context, id string, err error) error {
	q.log.WarnContext(ctx, "publish job failed", slog.String("job_id", id), slog.Any("error", err))
	return &refusal{kind: errQueueUnavailable, cause: err}
}

// jobStream is the job stream (the tenants' backlogs), looked up once.
func (q *jobQueue) jobStream(ctx context.Context) (jetstream.Stream, error) {
	if st := q.jobs.Load(); st != nil {
		return *st, nil
	}
	cctx, cancel := context.WithTimeout(ctx, q.cfg.PublishTimeout)
	defer cancel()
	st, err := q.js.Stream(cctx, job.StreamName)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", job.StreamName, err)
	}
	q.jobs.Store(&st)
	return st, nil
}

// rollback removes a job recorded as queued that will not be published, with
// its in-flight claim, on a context that survives the request's end.
func (q *jobQueue) rollback(ctx context.Context, msg job.Message) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := q.store.DeleteJob(ctx, msg.ID); err != nil && !errors.Is(err, cache.ErrNotFound) {
		q.log.ErrorContext(ctx, "roll back unpublished job", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
	if err := q.store.ReleaseInflight(ctx, msg.Key, msg.ID); err != nil {
		q.log.ErrorContext(ctx, "release in-flight claim of unpublished job", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
}

// republish publishes a queued leader's message again while JetStream's
// duplicate window still covers it, which is a no-op when the leader did
// publish. If the process that recorded the leader died before publishing,
// this is what gets the job (and every submission coalesced onto it) run.
func (q *jobQueue) republish(ctx context.Context, rec *cache.Record) {
	window := cmp.Or(q.cfg.Queue.DuplicateWindow, queue.DefaultDuplicateWindow)
	if rec.Status != job.StatusQueued || rec.Published || time.Since(rec.Message.CreatedAt) > window-time.Minute {
		return
	}
	if err := q.publishConfirmed(ctx, rec.Message); err != nil {
		q.log.WarnContext(ctx, "republish coalesced leader", slog.String("job_id", rec.Message.ID), slog.Any("error", err))
	}
}
