package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// A submission, apart from how it came: submit is the one domain call every
// transport makes (POST /v1/jobs, batches, replays, tool calls) once it has
// decoded a spec. It validates the spec against the runtime and the
// tenant's settings, then takes the domain steps in order: idempotency,
// result cache, budget, record, coalescing with an identical job in
// flight, publish, and the tenant's audit record. Its refusals are the
// sentinel errors of errors.go; the transport answers them through
// toProblem, and an answer with answer.httpStatus (submit.go).

// answer is what one accepted submission is answered with: the job it names and
// how GET /v1/jobs/{id} shows it.
type answer struct {
	id string
	// done: body is a terminal result (a cache hit, or a job that had
	// already ended), not a job still queued or running.
	done bool
	body any // *resultView or *pendingView
}

// submitOptions are what a transport adds to a spec.
type submitOptions struct {
	// idemKey is the client's Idempotency-Key ("" for none) and bodyHash
	// the fingerprint of the request it came with: the same key with
	// another body is errIdempotencyKeyReused.
	idemKey, bodyHash string
	replayOf          string // the job this one replays (replay.go)
	// waiter, when set, is told the job's id just before this submission
	// publishes it (and only then): a transport that waits for the job
	// subscribes to its done notice there (wait.go).
	waiter *doneWaiter
}

// candidate is a submission past its checks: the job it would be.
type candidate struct {
	tenant string
	spec   job.Spec // normalized, its network canonical and its limits resolved
	scope  string   // the tenant's result-cache scope
	key    string   // the cache key, within scope
	id     string
	// claimed: an Idempotency-Key names id, so a retry of the submission
	// may use it concurrently; otherwise no one but this submission knows
	// id until it is answered.
	claimed bool
	traceID string
}

// recordOutcome answers a submission with an existing job's record.
func recordOutcome(rec *cache.Record) answer {
	body, terminal := recordView(rec)
	return answer{id: rec.Message.ID, done: terminal, body: body}
}

// submissions take the domain steps of a submission; they own the
// templates of the cache hits this process has answered (cachehit.go).
type submissions struct {
	cfg      *Config
	store    Store
	blobs    *blob.Store // a cached result's artifacts and output, checked
	runtimes *registry
	tenants  *tenants
	budgets  *budgets
	queue    *jobQueue
	events   *eventStreams // a queued job's first event
	waits    *waits        // a waiting submission's subscription
	audit    *auditLog
	tracer   trace.Tracer
	metrics  *ktrace.Metrics
	tmetrics *tenantMetrics
	log      *slog.Logger
	// hitTemplates are the answers of known cache entries (cachehit.go).
	hitTemplates hitTemplates
}

// submit runs one submission of tenant's and records it in the tenant's
// audit log. Attributes are added to ctx's span (the transport's submit
// span).
func (sub *submissions) submit(ctx context.Context, tenant string, spec job.Spec, opts submitOptions) (answer, error) {
	out, err := sub.submitJob(ctx, tenant, spec, opts)
	sub.audit.auditSubmission(ctx, tenant, spec, opts, out, err)
	return out, err
}

// submitJob is submit without its audit record: the checks, then
// idempotency, the result cache, and the job's record and publish.
func (sub *submissions) submitJob(ctx context.Context, tenant string, spec job.Spec, opts submitOptions) (answer, error) {
	span := trace.SpanFromContext(ctx)
	c, err := sub.check(ctx, span, tenant, spec)
	if err != nil {
		return answer{}, err
	}
	if opts.idemKey != "" {
		if out, ok, err := sub.claimKey(ctx, span, &c, opts); err != nil || ok {
			return out, err
		}
	}
	span.SetAttributes(ktrace.JobIDKey.String(c.id))
	if !c.spec.CacheEnabled() {
		span.SetAttributes(ktrace.CacheHitKey.Bool(false))
	} else if out, ok, err := sub.cached(ctx, span, &c); err != nil || ok {
		return out, err
	}
	return sub.enqueue(ctx, span, &c, opts)
}

// check validates spec against the runtime it names and its tenant's
// settings (network, callback, rate and CPU quotas), and returns the job it
// would be.
func (sub *submissions) check(ctx context.Context, span trace.Span, tenant string, spec job.Spec) (candidate, error) {
	spec.Normalize()
	span.SetAttributes(ktrace.RuntimeKey.String(spec.Runtime))
	if err := spec.Validate(); err != nil {
		return candidate{}, err
	}
	// Before the key: the canonical allowlist is part of it.
	network, err := sub.tenants.checkNetwork(tenant, spec.Network)
	if err != nil {
		return candidate{}, err
	}
	spec.Network = network
	if err := sub.tenants.checkCallback(ctx, tenant, spec.CallbackURL); err != nil {
		return candidate{}, err
	}
	rt, err := sub.runtimes.lookup(ctx, spec.Runtime)
	if err != nil {
		return candidate{}, err
	}
	// The runtime's own file and variable names, as its workers advertise them.
	if err := spec.ValidateFor(rt.RuntimeContract); err != nil {
		return candidate{}, err
	}
	if spec.Limits, err = rt.Limits.Resolve(spec.Limits); err != nil {
		return candidate{}, err
	}
	if err := spec.FitsLimits(spec.Limits); err != nil {
		return candidate{}, err
	}
	if err := sub.tenants.admit(ctx, tenant); err != nil {
		return candidate{}, err
	}
	c := candidate{tenant: tenant, spec: spec, scope: sub.tenants.cacheScope(tenant), id: job.NewID()}
	c.key = job.ScopedKey(c.scope, spec, rt.Digest)
	if sc := span.SpanContext(); sc.HasTraceID() {
		c.traceID = sc.TraceID().String()
	}
	if span.IsRecording() { // else the attributes would be built for nothing
		span.SetAttributes(ktrace.CodeSHA256Key.String(job.CodeSHA256(spec.Code)), ktrace.CacheKeyKey.String(c.key))
		span.SetAttributes(ktrace.LimitAttrs(spec.Limits)...)
	}
	return c, nil
}

// claimKey claims the submission's Idempotency-Key for c. A retry (the key
// was claimed with the same body) is answered with the earlier job when it
// has a record (ok); when it has none (it was a cache hit, or its publish
// failed and was rolled back), c takes the earlier job's id and the
// submission goes on under it.
func (sub *submissions) claimKey(ctx context.Context, span trace.Span, c *candidate, opts submitOptions) (out answer, ok bool, err error) {
	c.claimed = true
	prev, hash, claimed, err := sub.store.ClaimIdempotency(ctx, c.tenant, opts.idemKey, opts.bodyHash, c.id)
	if err != nil || claimed {
		return answer{}, false, err
	}
	if hash != opts.bodyHash {
		return answer{}, false, &refusal{kind: errIdempotencyKeyReused, field: "Idempotency-Key",
			detail: fmt.Sprintf("Idempotency-Key %q was used for job %s with a different request body; use a new key for a different job", opts.idemKey, prev)}
	}
	c.id = prev
	rec, err := tenantJob(ctx, sub.store, c.tenant, prev)
	if errors.Is(err, cache.ErrNotFound) {
		return answer{}, false, nil
	}
	if err != nil {
		return answer{}, false, err
	}
	span.SetAttributes(ktrace.JobIDKey.String(prev), attribute.Bool("kiln.idempotent_replay", true))
	sub.tmetrics.submission(ctx, c.tenant, "replayed")
	// The first attempt may have died, or timed out, before JetStream
	// confirmed the publish: make sure it is queued.
	if err := sub.queue.ensurePublished(ctx, &rec); err != nil {
		return answer{}, false, err
	}
	return recordOutcome(&rec), true, nil
}

// cached answers c from the result cache when it holds a fresh enough
// result of c's key (ok), recording the hit under c's id.
func (sub *submissions) cached(ctx context.Context, span trace.Span, c *candidate) (out answer, ok bool, err error) {
	if out, ok := sub.knownHit(ctx, span, c, maxCacheAge(c.spec, sub.cfg.CacheMaxAge)); ok {
		return out, true, nil
	}
	hitMsg := job.Message{ID: c.id, Spec: c.spec, Key: c.key, TraceID: c.traceID, Tenant: c.tenant, CacheScope: c.scope}
	res, hit, err := sub.lookupResult(ctx, c.key, maxCacheAge(c.spec, sub.cfg.CacheMaxAge))
	if err != nil {
		return answer{}, false, err
	}
	span.SetAttributes(ktrace.CacheHitKey.Bool(hit))
	if hit && (len(res.Artifacts) > 0 || res.Spilled()) {
		if hit, err = sub.artifactsStored(ctx, c.tenant, res); err != nil {
			return answer{}, false, err
		}
	}
	if !hit {
		sub.metrics.CacheMiss(ctx, c.spec.Runtime)
		return answer{}, false, nil
	}
	sub.countCacheHit(ctx, hitMsg)
	view := cacheHitView(res, c.id, c.traceID, sub.cfg.Now().UTC(), c.spec.Metadata)
	// Recorded, so the id answers a later GET and the artifacts download
	// under it.
	hitMsg.CreatedAt = *view.CreatedAt
	sub.queue.recordCacheHit(ctx, hitMsg, view.Result)
	view.Links = jobLinks(c.id)
	return answer{id: c.id, done: true, body: view}, true, nil
}

// enqueue holds c's budget, applies its tenant's queued-jobs quota, records
// it as queued, coalesces it with an identical job in flight, or else
// publishes it.
func (sub *submissions) enqueue(ctx context.Context, span trace.Span, c *candidate, opts submitOptions) (answer, error) {
	tenant, spec, id := c.tenant, c.spec, c.id
	// A job naming a budget holds one run of it from here (budgets.go).
	hold, err := sub.budgets.holdBudget(ctx, tenant, id, spec)
	if err != nil {
		return answer{}, err
	}
	defer hold.done(ctx)
	msg := job.Message{ID: id, Spec: spec, Key: c.key, CreatedAt: sub.cfg.Now().UTC(), TraceID: c.traceID,
		Tenant: tenant, CacheScope: c.scope, Quota: sub.tenants.workerQuota(tenant), Redact: sub.tenants.tenant(tenant).Redact, ReplayOf: opts.replayOf}
	if err := sub.tenants.checkQueued(ctx, msg); err != nil {
		return answer{}, err
	}
	if msg, err = sub.queue.byReference(ctx, msg); err != nil {
		return answer{}, fmt.Errorf("%w: %w", cache.ErrUnavailable, err)
	}
	if err := sub.createJob(ctx, msg); err != nil {
		if errors.Is(err, cache.ErrExists) {
			// A concurrent retry with the same Idempotency-Key got here first.
			rec, gerr := tenantJob(ctx, sub.store, tenant, id)
			if gerr != nil {
				return answer{}, gerr
			}
			return recordOutcome(&rec), nil
		}
		return answer{}, err
	}

	// A job with its own callback runs on its own: coalesced onto another
	// job, its callback would never be sent.
	if spec.CacheEnabled() && spec.CallbackURL == "" {
		if out, ok, err := sub.coalesce(ctx, span, msg); err != nil || ok {
			return out, err
		}
	}

	sub.events.publishQueued(ctx, id) // before the job can reach a worker, so it comes first
	opts.waiter.subscribe(sub.waits, id)
	if err := sub.queue.publishRecorded(ctx, msg); err != nil {
		return answer{}, err
	}
	hold.keep()
	sub.metrics.JobSubmitted(ctx, spec.Runtime)
	sub.tmetrics.submission(ctx, tenant, "queued")
	sub.log.DebugContext(ctx, "job queued", slog.String("job_id", id), slog.String("runtime", spec.Runtime), slog.String("caller", tenant))
	created := msg.CreatedAt
	return answer{id: id, body: &pendingView{
		ID: id, Status: job.StatusQueued, CreatedAt: &created, TraceID: c.traceID, Metadata: spec.Metadata, Links: jobLinks(id),
	}}, nil
}

// coalesce answers msg, just recorded, with the identical job of its
// tenant already in flight, if there is one (ok): msg's record is rolled
// back and the leader republished if it may never have been.
func (sub *submissions) coalesce(ctx context.Context, span trace.Span, msg job.Message) (out answer, ok bool, err error) {
	leader, claimed, err := sub.store.ClaimInflight(ctx, msg.Key, msg.ID)
	if err != nil {
		sub.queue.rollback(ctx, msg)
		return answer{}, false, err
	}
	if claimed {
		return answer{}, false, nil
	}
	// The leader created its record before claiming, so it is there unless
	// the leader was rolled back or expired meanwhile; then this job simply
	// runs on its own. A leader of another tenant (one sharing the cache
	// group) is not handed out: this job runs on its own instead.
	rec, err := tenantJob(ctx, sub.store, msg.Tenant, leader)
	switch {
	case err == nil && !maps.Equal(rec.Message.Spec.Metadata, msg.Spec.Metadata):
		// The leader's labels are not this job's: it runs on its own, so
		// each answer carries the metadata its submission sent.
		return answer{}, false, nil
	case err == nil:
		sub.queue.rollback(ctx, msg)
		span.SetAttributes(attribute.String("kiln.coalesced_with", leader))
		sub.queue.republish(ctx, &rec)
		sub.tmetrics.submission(ctx, msg.Tenant, "coalesced")
		return recordOutcome(&rec), true, nil
	case errors.Is(err, cache.ErrNotFound):
		return answer{}, false, nil
	default:
		sub.queue.rollback(ctx, msg)
		return answer{}, false, err
	}
}

// lookupResult reads the result cache; an entry older than maxAge (by its
// finished_at) is a miss, so the job runs again and replaces it.
func (sub *submissions) lookupResult(ctx context.Context, key string, maxAge time.Duration) (job.Result, bool, error) {
	ctx, span := sub.tracer.Start(ctx, ktrace.SpanCacheLookup, trace.WithAttributes(ktrace.CacheKeyKey.String(key)))
	defer span.End()
	res, hit, err := sub.store.LookupResult(ctx, key)
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

// createJob records the job as queued, and as not yet published (the
// cache.store span: the write that makes the job visible to GET and to the
// worker).
func (sub *submissions) createJob(ctx context.Context, msg job.Message) error {
	ctx, span := sub.tracer.Start(ctx, ktrace.SpanCacheStore, trace.WithAttributes(ktrace.JobIDKey.String(msg.ID)))
	defer span.End()
	err := sub.store.CreateUnpublishedJob(ctx, msg)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// artifactsStored reports whether every artifact of res, and its output
// when that is kept in the object store, is stored under tenant and will
// outlive a record made now. A cached Result whose
// artifacts are not (another tenant's job, or expired content) is not served
// from the cache: the job runs again and stores its own.
func (sub *submissions) artifactsStored(ctx context.Context, tenant string, res job.Result) (bool, error) {
	for _, a := range res.Artifacts {
		ok, err := sub.blobs.Has(ctx, job.ObjectRef{Tenant: tenant, SHA256: a.SHA256, Size: a.Size})
		if err != nil || !ok {
			return false, err
		}
	}
	// Output kept in the object store is named by the reference itself.
	for _, o := range []*job.OutputObject{res.StdoutObject, res.StderrObject} {
		if o == nil {
			continue
		}
		if o.Tenant != tenant {
			return false, nil
		}
		ok, err := sub.blobs.Has(ctx, o.ObjectRef)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}
