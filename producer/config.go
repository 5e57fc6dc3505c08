package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Defaults applied to zero Config fields.
const (
	MaxBatchDefault           = 100
	MaxWaitDefault            = 60 * time.Second
	PublishTimeoutDefault     = 2 * time.Second
	RuntimeCacheTTLDefault    = 2 * time.Second
	RetryAfterDefault         = 2 * time.Second
	QueueFullRetryDefault     = 5 * time.Second
	BodyWaitDefault           = 2 * time.Second
	CacheMaxAgeDefault        = 10 * time.Minute
	MaxListBytesDefault       = 16 << 20
	ToolCallQueueSlackDefault = 30 * time.Second
	ReconcileAfterDefault     = 15 * time.Second
	ReconcileEveryDefault     = 5 * time.Second
	EventStallTimeoutDefault  = 30 * time.Second
)

// Config configures a Server. Zero fields take the default named beside them.
type Config struct {
	// Store is the Redis layer, normally a *cache.Store. Required.
	Store Store
	// NATS publishes cancel requests and completion notices and subscribes to
	// completion notices for long-polls. Required.
	NATS *nats.Conn
	// JetStream publishes jobs. Default: jetstream.New(NATS).
	JetStream jetstream.JetStream
	// Queue sizes the KILN_JOBS stream, which New creates or updates.
	// Default: the queue package defaults.
	Queue queue.Config
	// Blob sizes the object store of artifacts and inputs sent by reference,
	// which New creates or updates; it must match the workers'. Default: the
	// blob package defaults.
	Blob blob.Config
	// Events sizes the KILN_EVENTS stream of live job events, which New
	// creates or updates; it must match the workers'. Default: the events
	// package defaults.
	Events events.Config
	// Audit sizes the KILN_AUDIT stream of tenants' audit logs (retention),
	// which the API creates or updates. Default: the audit package defaults.
	Audit audit.Config
	// Policy bounds job limits: a runtime registered with its own policy gets
	// the stricter of the two per field. Default job.DefaultPolicy().
	Policy job.Policy
	// APIKeys maps each accepted bearer key to a name (used in logs and as
	// the Idempotency-Key scope). Empty means dev mode: no authentication,
	// logged at WARN when the server is created.
	APIKeys map[string]string
	// MaxBodyBytes bounds request bodies. Default job.MaxSpecJSONSize.
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes of request bodies held at once
	// (each request counts its Content-Length, or MaxBodyBytes when unknown,
	// until it is answered). Default 2 × MaxBodyBytes; at least MaxBodyBytes.
	MaxBodyBytesInFlight int64
	// BodyWait is how long a request waits for room in MaxBodyBytesInFlight
	// before it is answered 503 with Retry-After. Default BodyWaitDefault (2s).
	BodyWait time.Duration
	// CacheMaxAge is the oldest cached result a job with "cache": true (or no
	// "cache") is answered with; {"max_age_s": N} asks for another bound.
	// Default CacheMaxAgeDefault (10m).
	CacheMaxAge time.Duration
	// Tenants sets, by tenant name (the name of its API keys), the tenant's
	// quotas and cache group. A tenant not listed has no quotas and a cache
	// of its own. In dev mode the one tenant is job.DefaultTenant.
	Tenants map[string]Tenant
	// MetricsTenants caps the tenants named in per-tenant metric labels;
	// others are counted as "other". Default MetricsTenantsDefault (50).
	MetricsTenants int
	// TenantMetrics counts submissions and quota refusals per tenant.
	// Default: none.
	TenantMetrics *ktrace.TenantMetrics
	// MaxListBytes bounds the jobs rendered in one GET /v1/jobs?ids= answer;
	// ids past it get a response-too-large error entry instead, without
	// being read. Default MaxListBytesDefault (16 MiB).
	MaxListBytes int64
	// MaxBatch bounds the jobs of one batch and the ids of one list request.
	// Default MaxBatchDefault (100).
	MaxBatch int
	// MaxWait bounds ?wait= long-polls; longer waits are shortened to it.
	// Default MaxWaitDefault (60s).
	MaxWait time.Duration
	// SessionsPerTenant bounds each tenant's live sessions (sessions.go).
	// Default SessionsPerTenantDefault (10).
	SessionsPerTenant int
	// SessionWorkerLapse is how long a session's worker must stay silent
	// with its lease missing from the store (the store answering) before
	// the API counts the worker gone and brings its sessions back on
	// another worker (sessions_holder.go). A live worker re-takes a lease
	// the store lost (an outage longer than its IDLease) within IDLease/3
	// of the store coming back, so this should be at least the workers'
	// IDLease. Default SessionWorkerLapseDefault (10s, the workers' default
	// IDLease).
	SessionWorkerLapse time.Duration
	// PublishTimeout bounds one JetStream publish; past it the client is told
	// 503 "outcome unknown" with the job id, and the job is kept for a retry
	// or the reconciler (publish.go). Default PublishTimeoutDefault (2s).
	PublishTimeout time.Duration
	// RuntimeCacheTTL is how long the runtime registry read from Redis is
	// reused, so the submit path does not read it every request. A runtime
	// not in the cached copy triggers an early re-read. Default 2s.
	RuntimeCacheTTL time.Duration
	// RetryAfter is the Retry-After given with 503 answers. Default 2s.
	RetryAfter time.Duration
	// QueueFullRetryAfter is the Retry-After given with 429 (queue full). Default 5s.
	QueueFullRetryAfter time.Duration
	// ToolCallQueueSlack is how long POST /v1/tool-calls waits for a job
	// beyond its wall-clock limit (queueing, start-up) before answering that
	// it has not finished. Default ToolCallQueueSlackDefault (30s).
	ToolCallQueueSlack time.Duration
	// EventStallTimeout is how long an event stream's client may take no
	// data before the stream is cut off (the client reconnects with
	// Last-Event-ID). Default EventStallTimeoutDefault (30s).
	EventStallTimeout time.Duration
	// ReconcileAfter is how old a queued job whose publish was never
	// confirmed must be before Reconcile republishes it (younger ones may
	// still be on their way). Default ReconcileAfterDefault (15s).
	ReconcileAfter time.Duration
	// ReconcileInterval is how often Reconcile looks. Default 5s.
	ReconcileInterval time.Duration
	// StoreProbeInterval is how often the API writes a probe message to
	// JetStream's store and to the object store (writeprobe.go); /readyz
	// fails while either write fails. Default 2s.
	StoreProbeInterval time.Duration
	// QueueDepthInterval is how often the queue gauges (kiln_queue_*) are
	// polled from JetStream, when Metrics is set. Default 5s.
	QueueDepthInterval time.Duration
	// Logger receives the server's log lines. Default: discard.
	Logger *slog.Logger
	// TracerProvider creates the submit spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context of requests and writes it into NATS
	// headers. Default propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator
	// Metrics counts submissions and cache hits and misses. Default: none.
	Metrics *ktrace.Metrics
	// Now is the server's clock: what it records and judges against the
	// store reads it (the runtime registry's cached copy, RuntimeCacheTTL;
	// sessions' lifetimes, budgets' windows, quotas, records' times).
	// Network deadlines and latencies are the wall clock's. Default
	// time.Now; tests pass a manual clock.
	Now func() time.Time
	// Callbacks checks a job's callback_url when it is submitted (normally a
	// callback.Policy). Default nil: jobs naming a callback_url are refused.
	Callbacks CallbackChecker
	// TraceURL is where the run page (/ui/) links a run's trace: a URL with
	// "{trace_id}" in it, such as Jaeger's
	// http://127.0.0.1:16686/trace/{trace_id}. Default "": the page shows
	// the trace id without a link.
	TraceURL string
}

// CallbackChecker refuses callback URLs a tenant may not use; the error is a
// *job.InvalidError naming callback_url and saying why.
type CallbackChecker interface {
	Check(ctx context.Context, tenant, rawURL string) error
}

// Validate reports the first unusable field. Zero fields are valid where they
// have a default.
func (c Config) Validate() error {
	if c.Store == nil {
		return errors.New("producer config: Store is required")
	}
	if c.NATS == nil {
		return errors.New("producer config: NATS is required")
	}
	c = c.withDefaults()
	if err := c.Policy.Validate(); err != nil {
		return fmt.Errorf("producer config: %w", err)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBodyBytes", c.MaxBodyBytes}, {"MaxBatch", int64(c.MaxBatch)},
		{"MaxWait", int64(c.MaxWait)}, {"PublishTimeout", int64(c.PublishTimeout)},
		{"RuntimeCacheTTL", int64(c.RuntimeCacheTTL)}, {"RetryAfter", int64(c.RetryAfter)},
		{"QueueFullRetryAfter", int64(c.QueueFullRetryAfter)},
		{"MaxBodyBytesInFlight", c.MaxBodyBytesInFlight}, {"BodyWait", int64(c.BodyWait)},
		{"CacheMaxAge", int64(c.CacheMaxAge)}, {"MaxListBytes", c.MaxListBytes}, {"MetricsTenants", int64(c.MetricsTenants)},
		{"ToolCallQueueSlack", int64(c.ToolCallQueueSlack)}, {"EventStallTimeout", int64(c.EventStallTimeout)},
		{"SessionWorkerLapse", int64(c.SessionWorkerLapse)},
	} {
		if f.v < 0 {
			return fmt.Errorf("producer config: %s is negative; use a positive value or 0 for the default", f.name)
		}
	}
	if c.MaxBodyBytesInFlight < c.MaxBodyBytes {
		return fmt.Errorf("producer config: MaxBodyBytesInFlight (%d) is below MaxBodyBytes (%d): no body at the limit could ever be read", c.MaxBodyBytesInFlight, c.MaxBodyBytes)
	}
	for name, t := range c.Tenants {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("producer config: tenant %q: %w", name, err)
		}
	}
	for k, name := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("producer config: API key named %q is empty", name)
		}
	}
	if c.TraceURL != "" {
		if u, err := url.Parse(c.TraceURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.Contains(c.TraceURL, "{trace_id}") {
			return fmt.Errorf("producer config: TraceURL %q must be an http(s) URL holding {trace_id}", c.TraceURL)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Policy == (job.Policy{}) {
		c.Policy = job.DefaultPolicy()
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, job.MaxSpecJSONSize)
	c.MaxBodyBytesInFlight = cmp.Or(c.MaxBodyBytesInFlight, 2*c.MaxBodyBytes)
	c.BodyWait = cmp.Or(c.BodyWait, BodyWaitDefault)
	c.CacheMaxAge = cmp.Or(c.CacheMaxAge, CacheMaxAgeDefault)
	c.MaxListBytes = cmp.Or(c.MaxListBytes, MaxListBytesDefault)
	c.MetricsTenants = cmp.Or(c.MetricsTenants, MetricsTenantsDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.SessionsPerTenant = cmp.Or(c.SessionsPerTenant, SessionsPerTenantDefault)
	c.SessionWorkerLapse = cmp.Or(c.SessionWorkerLapse, SessionWorkerLapseDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.RuntimeCacheTTL = cmp.Or(c.RuntimeCacheTTL, RuntimeCacheTTLDefault)
	c.RetryAfter = cmp.Or(c.RetryAfter, RetryAfterDefault)
	c.QueueFullRetryAfter = cmp.Or(c.QueueFullRetryAfter, QueueFullRetryDefault)
	c.ToolCallQueueSlack = cmp.Or(c.ToolCallQueueSlack, ToolCallQueueSlackDefault)
	c.EventStallTimeout = cmp.Or(c.EventStallTimeout, EventStallTimeoutDefault)
	c.ReconcileAfter = cmp.Or(c.ReconcileAfter, ReconcileAfterDefault)
	c.ReconcileInterval = cmp.Or(c.ReconcileInterval, ReconcileEveryDefault)
	c.QueueDepthInterval = cmp.Or(c.QueueDepthInterval, queueDepthInterval)
	c.StoreProbeInterval = cmp.Or(c.StoreProbeInterval, storeProbeInterval)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return c
}
