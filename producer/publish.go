package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
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

// publishRecorded publishes a job whose record exists, with the outcomes above.
func (s *Server) publishRecorded(ctx context.Context, msg job.Message) error {
	err := s.publishConfirmed(ctx, msg)
	if err == nil || errors.Is(err, errPublishUnconfirmed) {
		return err
	}
	s.rollback(ctx, msg)
	s.forgetUnpublished(ctx, msg.ID)
	return err
}

// publishConfirmed publishes msg and, once JetStream acknowledged it, marks
// the record published. A failure to mark is only logged: the reconciler's
// republish of a published job is a duplicate JetStream drops (within the
// window) or a worker acks at once (the job is terminal by then).
func (s *Server) publishConfirmed(ctx context.Context, msg job.Message) error {
	if err := s.publish(ctx, msg); err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.store.MarkPublished(mctx, msg.ID); err != nil {
		s.log.WarnContext(ctx, "mark job published", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
	return nil
}

// ensurePublished republishes a queued job whose publish was never
// confirmed (an idempotent replay after a timeout or a crash).
func (s *Server) ensurePublished(ctx context.Context, rec *cache.Record) error {
	if rec.Status != job.StatusQueued || rec.Published || rec.CacheHit {
		return nil
	}
	if err := s.publishConfirmed(ctx, rec.Message); err != nil {
		var r *refusal
		if errors.As(err, &r) {
			// Refused: nothing was queued this time either, and the record
			// stays for the reconciler or the client's next retry.
			r.recorded = rec.Message.ID
		}
		return err
	}
	s.metrics.JobRepublished(ctx, rec.Message.Spec.Runtime)
	s.log.InfoContext(ctx, "republished a job whose publish was never confirmed", slog.String("job_id", rec.Message.ID))
	return nil
}

// publishUnconfirmed is errPublishUnconfirmed for job id, logged.
func (s *Server) publishUnconfirmed(ctx context.Context, id string, err error) error {
	s.log.WarnContext(ctx, "publish job unconfirmed", slog.String("job_id", id), slog.Any("error", err))
	return &refusal{kind: errPublishUnconfirmed, recorded: id, cause: err}
}

func (s *Server) forgetUnpublished(ctx context.Context, id string) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.store.ForgetUnpublished(fctx, id); err != nil {
		s.log.WarnContext(ctx, "forget unpublished job", slog.String("job_id", id), slog.Any("error", err))
	}
}

// recordCacheHit stores the cache-hit answer under its id, so a later GET
// finds it. A failure is logged: the answer itself is already complete.
func (s *Server) recordCacheHit(ctx context.Context, msg job.Message, res job.Result) {
	if err := s.store.CreateAlias(ctx, msg, res); err != nil {
		s.log.WarnContext(ctx, "record cache hit; a later GET of this id answers 404", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
}

// sendJob publishes m until JetStream answers or ctx ends. "No responders"
// (no server has the stream right now: a restart, a leader election) is
// retried here rather than by the client library, so that when ctx ends on
// it the error still says no server took the message, which
// queue.PublishMayHaveStored reads as a definite "nothing was queued".
func (s *Server) sendJob(ctx context.Context, m *nats.Msg) error {
	var noOne error // the last "no server has the stream" answer
	for {
		_, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectStream(job.StreamName), jetstream.WithRetryAttempts(0))
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
func (s *Server) publish(ctx context.Context, msg job.Message) error {
	if !s.nc.IsConnected() {
		return s.queueUnavailable(ctx, msg.ID, fmt.Errorf("nats connection is %s", s.nc.Status()))
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
	if n := s.tenant(tenant).Quota.MaxRunning; n > 0 {
		// The workers hold the tenant to it as they take its jobs.
		m.Header.Set(job.HeaderMaxRunning, strconv.FormatInt(n, 10))
	}
	ktrace.Inject(ctx, s.prop, m.Header)
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	if err := s.sendJob(pctx, m); err != nil {
		if queue.PublishMayHaveStored(err) {
			return s.publishUnconfirmed(ctx, msg.ID, err)
		}
		if queue.IsStreamFull(err) {
			s.log.WarnContext(ctx, "job queue full", slog.String("job_id", msg.ID))
			return &refusal{kind: errQueueFull, cause: err}
		}
		return s.queueUnavailable(ctx, msg.ID, err)
	}
	// Wake idle workers, naming the subject that holds the job; a lost
	// wake-up only delays the job to their next poll.
	_ = s.nc.Publish(job.WorkSubject(msg.Spec.Runtime), []byte(subject))
	return nil
}

// queueUnavailable is errQueueUnavailable for job id, logged.
func (s *Server) queueUnavailable(ctx context.Context, id string, err error) error {
	s.log.WarnContext(ctx, "publish job failed", slog.String("job_id", id), slog.Any("error", err))
	return &refusal{kind: errQueueUnavailable, cause: err}
}
