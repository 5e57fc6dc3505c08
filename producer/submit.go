package producer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

// outcome is the answer to one accepted submission.
type outcome struct {
	status int // 200 when the body is a terminal result, else 202
	id     string
	body   any
}

// submission is one job to submit, as parsed from a request.
type submission struct {
	spec     job.Spec
	caller   string
	idemKey  string
	bodyHash string
	replayOf string // the job this one replays (replay.go)
}

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := s.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, ktrace.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	wait, p := s.parseWait(r)
	if p != nil {
		s.fail(ctx, w, span, p)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > maxIdempotencyKey {
		p := newProblem(http.StatusBadRequest, typeInvalidParameter, "Idempotency-Key too long",
			fmt.Sprintf("the Idempotency-Key header is %d bytes; the maximum is %d (a UUID is a good key)", len(idem), maxIdempotencyKey))
		p.Field = "Idempotency-Key"
		s.fail(ctx, w, span, p)
		return
	}
	release, p := s.reserveBody(ctx, r)
	if p != nil {
		s.fail(ctx, w, span, p)
		return
	}
	defer release()
	body, p := readBody(w, r, s.cfg.MaxBodyBytes)
	if p != nil {
		s.fail(ctx, w, span, p)
		return
	}
	sub := submission{caller: caller, idemKey: idem}
	if p := decodeChecked(body, &sub.spec, specSchema, ""); p != nil {
		s.fail(ctx, w, span, p)
		return
	}
	if idem != "" {
		sum := sha256.Sum256(body)
		sub.bodyHash = hex.EncodeToString(sum[:])
	}
	out, err := s.submitAudited(ctx, span, sub)
	if err != nil {
		s.fail(ctx, w, span, s.toProblem(ctx, "submit job", err))
		return
	}
	if wait > 0 && out.status == http.StatusAccepted {
		rec, err := s.await(ctx, caller, out.id, wait)
		if err == nil {
			var terminal bool
			out.body, terminal = recordView(&rec)
			if terminal {
				out.status = http.StatusOK
			}
		} else if !errors.Is(err, cache.ErrNotFound) {
			// The job was accepted: answer that, not the wait's failure.
			s.log.WarnContext(ctx, "wait after submit", slog.String("job_id", out.id), slog.Any("error", err))
		}
	}
	if out.status == http.StatusAccepted {
		w.Header().Set("Location", "/v1/jobs/"+out.id)
	}
	s.writeBody(ctx, w, out.status, out.body)
}

// fail answers p and marks the span as failed for server-side problems.
func (s *Server) fail(ctx context.Context, w http.ResponseWriter, span trace.Span, p *problem) {
	if p.Status >= 500 {
		span.SetStatus(codes.Error, p.Detail)
	}
	span.SetAttributes(attribute.Int("http.response.status_code", p.Status))
	writeProblem(w, p)
}

// submit runs one submission: validate, idempotency, result cache,
// coalescing with an identical job in flight, record, publish. span is the
// submission's submit span (attributes are added to it).
func (s *Server) submit(ctx context.Context, span trace.Span, sub submission) (outcome, error) {
	spec := sub.spec
	spec.Normalize()
	span.SetAttributes(ktrace.RuntimeKey.String(spec.Runtime))
	if err := spec.Validate(); err != nil {
		return outcome{}, err
	}
	// Before the key: the canonical allowlist is part of it.
	network, err := s.checkNetwork(sub.caller, spec.Network)
	if err != nil {
		return outcome{}, err
	}
	spec.Network = network
	if err := s.checkCallback(ctx, sub.caller, spec.CallbackURL); err != nil {
		return outcome{}, err
	}
	rt, err := s.runtimes.lookup(ctx, spec.Runtime)
	if err != nil {
		return outcome{}, err
	}
	// The runtime's own file and variable names, as its workers advertise them.
	if err := spec.ValidateFor(rt.RuntimeContract); err != nil {
		return outcome{}, err
	}
	if spec.Limits, err = rt.Limits.Resolve(spec.Limits); err != nil {
		return outcome{}, err
	}
	if err := spec.FitsLimits(spec.Limits); err != nil {
		return outcome{}, err
	}
	if err := s.admit(ctx, sub.caller); err != nil {
		return outcome{}, err
	}
	scope := s.cacheScope(sub.caller)
	key := job.ScopedKey(scope, spec, rt.Digest)
	id := job.NewID()
	traceID := ""
	if sc := span.SpanContext(); sc.HasTraceID() {
		traceID = sc.TraceID().String()
	}
	if span.IsRecording() { // else the attributes would be built for nothing
		span.SetAttributes(ktrace.CodeSHA256Key.String(job.CodeSHA256(spec.Code)), ktrace.CacheKeyKey.String(key))
		span.SetAttributes(ktrace.LimitAttrs(spec.Limits)...)
	}

	if sub.idemKey != "" {
		prev, hash, claimed, err := s.store.ClaimIdempotency(ctx, sub.caller, sub.idemKey, sub.bodyHash, id)
		if err != nil {
			return outcome{}, err
		}
		if !claimed {
			if hash != sub.bodyHash {
				p := newProblem(http.StatusUnprocessableEntity, typeIdempotencyReused, "Idempotency-Key reused",
					fmt.Sprintf("Idempotency-Key %q was used for job %s with a different request body; use a new key for a different job", sub.idemKey, prev))
				p.Field = "Idempotency-Key"
				return outcome{}, p
			}
			// A retry: answer with the earlier job. When it has no record (it
			// was a cache hit, or its publish failed and was rolled back), the
			// submission is processed again under the same id.
			id = prev
			if rec, err := s.tenantJob(ctx, sub.caller, id); err == nil {
				span.SetAttributes(ktrace.JobIDKey.String(id), attribute.Bool("kiln.idempotent_replay", true))
				s.tmetrics.Submission(ctx, s.metricTenant(sub.caller), "replayed")
				// The first attempt may have died, or timed out, before
				// JetStream confirmed the publish: make sure it is queued.
				if err := s.ensurePublished(ctx, &rec); err != nil {
					return outcome{}, err
				}
				return recordOutcome(&rec), nil
			} else if !errors.Is(err, cache.ErrNotFound) {
				return outcome{}, err
			}
		}
	}
	span.SetAttributes(ktrace.JobIDKey.String(id))

	if spec.CacheEnabled() {
		hitMsg := job.Message{ID: id, Spec: spec, Key: key, TraceID: traceID, Tenant: sub.caller, CacheScope: scope}
		if out, ok := s.knownHit(ctx, span, hitMsg, s.maxCacheAge(spec)); ok {
			return out, nil
		}
		res, hit, err := s.lookupResult(ctx, key, s.maxCacheAge(spec))
		if err != nil {
			return outcome{}, err
		}
		span.SetAttributes(ktrace.CacheHitKey.Bool(hit))
		if hit && (len(res.Artifacts) > 0 || res.Spilled()) {
			if hit, err = s.artifactsStored(ctx, sub.caller, res); err != nil {
				return outcome{}, err
			}
		}
		if hit {
			s.countCacheHit(ctx, hitMsg)
			view := cacheHitView(res, id, traceID, time.Now().UTC())
			// Recorded, so the id answers a later GET and the artifacts
			// download under it.
			hitMsg.CreatedAt = *view.CreatedAt
			s.recordCacheHit(ctx, hitMsg, view.Result)
			view.Links = jobLinks(id)
			return outcome{status: http.StatusOK, id: id, body: view}, nil
		}
		s.metrics.CacheMiss(ctx, spec.Runtime)
	} else {
		span.SetAttributes(ktrace.CacheHitKey.Bool(false))
	}

	// A job naming a budget holds one run of it from here (budgets.go).
	hold, err := s.holdBudget(ctx, sub.caller, id, spec)
	if err != nil {
		return outcome{}, err
	}
	defer hold.done(ctx)
	msg := job.Message{ID: id, Spec: spec, Key: key, CreatedAt: time.Now().UTC(), TraceID: traceID,
		Tenant: sub.caller, CacheScope: scope, Quota: s.workerQuota(sub.caller), Redact: s.tenant(sub.caller).Redact, ReplayOf: sub.replayOf}
	if err := s.checkQueued(ctx, msg); err != nil {
		return outcome{}, err
	}
	if msg, err = s.byReference(ctx, msg); err != nil {
		return outcome{}, fmt.Errorf("%w: %w", cache.ErrUnavailable, err)
	}
	if err := s.store.NoteUnpublished(ctx, id, msg.CreatedAt); err != nil {
		return outcome{}, err
	}
	if err := s.createJob(ctx, msg); err != nil {
		if errors.Is(err, cache.ErrExists) {
			// A concurrent retry with the same Idempotency-Key got here first.
			rec, gerr := s.tenantJob(ctx, sub.caller, id)
			if gerr != nil {
				return outcome{}, gerr
			}
			return recordOutcome(&rec), nil
		}
		return outcome{}, err
	}

	// A job with its own callback runs on its own: coalesced onto another
	// job, its callback would never be sent.
	if spec.CacheEnabled() && spec.CallbackURL == "" {
		leader, claimed, err := s.store.ClaimInflight(ctx, key, id)
		if err != nil {
			s.rollback(ctx, msg)
			return outcome{}, err
		}
		if !claimed {
			// The leader created its record before claiming, so it is there
			// unless the leader was rolled back or expired meanwhile; then
			// this job simply runs on its own.
			// A leader of another tenant (one sharing the cache group) is
			// not handed out: this job runs on its own instead.
			rec, err := s.tenantJob(ctx, sub.caller, leader)
			switch {
			case err == nil:
				s.rollback(ctx, msg)
				span.SetAttributes(attribute.String("kiln.coalesced_with", leader))
				s.republish(ctx, &rec)
				s.tmetrics.Submission(ctx, s.metricTenant(sub.caller), "coalesced")
				return recordOutcome(&rec), nil
			case !errors.Is(err, cache.ErrNotFound):
				s.rollback(ctx, msg)
				return outcome{}, err
			}
		}
	}

	s.publishQueued(ctx, id) // before the job can reach a worker, so it comes first
	if err := s.publishRecorded(ctx, msg); err != nil {
		return outcome{}, err
	}
	hold.keep()
	s.metrics.JobSubmitted(ctx, spec.Runtime)
	s.tmetrics.Submission(ctx, s.metricTenant(sub.caller), "queued")
	s.log.DebugContext(ctx, "job queued", slog.String("job_id", id), slog.String("runtime", spec.Runtime), slog.String("caller", sub.caller))
	created := msg.CreatedAt
	return outcome{status: http.StatusAccepted, id: id, body: &pendingView{
		ID: id, Status: job.StatusQueued, CreatedAt: &created, TraceID: traceID, Links: jobLinks(id),
	}}, nil
}

// recordOutcome answers a submission with an existing job's record.
func recordOutcome(rec *cache.Record) outcome {
	body, terminal := recordView(rec)
	if terminal {
		return outcome{status: http.StatusOK, id: rec.Message.ID, body: body}
	}
	return outcome{status: http.StatusAccepted, id: rec.Message.ID, body: body}
}

// lookupResult reads the result cache; an entry older than maxAge (by its
// finished_at) is a miss, so the job runs again and replaces it.
func (s *Server) lookupResult(ctx context.Context, key string, maxAge time.Duration) (job.Result, bool, error) {
	ctx, span := s.tracer.Start(ctx, ktrace.SpanCacheLookup, trace.WithAttributes(ktrace.CacheKeyKey.String(key)))
	defer span.End()
	res, hit, err := s.store.LookupResult(ctx, key)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if hit && (res.FinishedAt == nil || time.Since(*res.FinishedAt) > maxAge) {
		hit = false
		span.SetAttributes(attribute.Bool("kiln.cache.stale", true))
	}
	span.SetAttributes(ktrace.CacheHitKey.Bool(hit))
	return res, hit, err
}

// createJob records the job as queued (the cache.store span: the write that
// makes the job visible to GET and to the worker).
func (s *Server) createJob(ctx context.Context, msg job.Message) error {
	ctx, span := s.tracer.Start(ctx, ktrace.SpanCacheStore, trace.WithAttributes(ktrace.JobIDKey.String(msg.ID)))
	defer span.End()
	err := s.store.CreateJob(ctx, msg)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// publish sends the job to JetStream with Nats-Msg-Id = id and the trace
// context in the headers, within PublishTimeout. Its errors are problems:
// 429 when the stream is full, 503 when NATS cannot take it.
func (s *Server) publish(ctx context.Context, msg job.Message) error {
	if !s.nc.IsConnected() {
		return s.queueUnavailable(ctx, msg.ID, fmt.Errorf("nats connection is %s", s.nc.Status()))
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode job message: %w", err)
	}
	if err := s.ensureTenantConsumer(ctx, msg); err != nil {
		return s.queueUnavailable(ctx, msg.ID, err)
	}
	m := nats.NewMsg(job.TenantJobSubject(msg.Spec.Runtime, tenantOfMsg(msg)))
	m.Data = data
	m.Header.Set(job.HeaderMsgID, msg.ID)
	m.Header.Set(job.HeaderJobID, msg.ID)
	ktrace.Inject(ctx, s.prop, m.Header)
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	if err := s.sendJob(pctx, m); err != nil {
		if queue.PublishMayHaveStored(err) {
			return s.publishUnconfirmed(ctx, msg.ID, err)
		}
		if queue.IsStreamFull(err) {
			p := newProblem(http.StatusTooManyRequests, typeQueueFull, "Job queue full",
				"the job queue is at its limit; nothing was queued, retry after the Retry-After delay")
			p.retryAfter = s.cfg.QueueFullRetryAfter
			p.cause = err
			s.log.WarnContext(ctx, "job queue full", slog.String("job_id", msg.ID))
			return p
		}
		return s.queueUnavailable(ctx, msg.ID, err)
	}
	// Wake idle workers; a lost wake-up only delays the job to their next poll.
	_ = s.nc.Publish(job.WorkSubject(msg.Spec.Runtime), nil)
	return nil
}

func (s *Server) queueUnavailable(ctx context.Context, id string, err error) *problem {
	s.log.WarnContext(ctx, "publish job failed", slog.String("job_id", id), slog.Any("error", err))
	p := newProblem(http.StatusServiceUnavailable, typeUnavailable, "Job queue unavailable",
		"the job queue (NATS JetStream) cannot take the job right now; nothing was queued, retry after the Retry-After delay")
	p.retryAfter = s.cfg.RetryAfter
	p.cause = err
	return p
}

// republish publishes a queued leader's message again while JetStream's
// duplicate window still covers it, which is a no-op when the leader did
// publish. If the process that recorded the leader died before publishing,
// this is what gets the job (and every submission coalesced onto it) run.
func (s *Server) republish(ctx context.Context, rec *cache.Record) {
	window := cmp.Or(s.cfg.Queue.DuplicateWindow, queue.DefaultDuplicateWindow)
	if rec.Status != job.StatusQueued || rec.Published || time.Since(rec.Message.CreatedAt) > window-time.Minute {
		return
	}
	if err := s.publishConfirmed(ctx, rec.Message); err != nil {
		s.log.WarnContext(ctx, "republish coalesced leader", slog.String("job_id", rec.Message.ID), slog.Any("error", err))
	}
}

// rollback removes a job recorded as queued that will not be published, with
// its in-flight claim, on a context that survives the request's end.
func (s *Server) rollback(ctx context.Context, msg job.Message) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.store.DeleteJob(ctx, msg.ID); err != nil && !errors.Is(err, cache.ErrNotFound) {
		s.log.ErrorContext(ctx, "roll back unpublished job", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
	if err := s.store.ReleaseInflight(ctx, msg.Key, msg.ID); err != nil {
		s.log.ErrorContext(ctx, "release in-flight claim of unpublished job", slog.String("job_id", msg.ID), slog.Any("error", err))
	}
}
