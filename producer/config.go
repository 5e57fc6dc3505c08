package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Defaults applied to zero Config fields.
const (
	MaxBatchDefault        = 100
	MaxWaitDefault         = 60 * time.Second
	PublishTimeoutDefault  = 2 * time.Second
	RuntimeCacheTTLDefault = 2 * time.Second
	RetryAfterDefault      = 2 * time.Second
	QueueFullRetryDefault  = 5 * time.Second
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
	// Policy bounds job limits: a runtime registered with its own policy gets
	// the stricter of the two per field. Default job.DefaultPolicy().
	Policy job.Policy
	// APIKeys maps each accepted bearer key to a name (used in logs and as
	// the Idempotency-Key scope). Empty means dev mode: no authentication,
	// logged at WARN when the server is created.
	APIKeys map[string]string
	// MaxBodyBytes bounds request bodies. Default job.MaxSpecJSONSize.
	MaxBodyBytes int64
	// MaxBatch bounds the jobs of one batch and the ids of one list request.
	// Default MaxBatchDefault (100).
	MaxBatch int
	// MaxWait bounds ?wait= long-polls; longer waits are shortened to it.
	// Default MaxWaitDefault (60s).
	MaxWait time.Duration
	// PublishTimeout bounds one JetStream publish; past it the job is rolled
	// back and the client told 503. Default PublishTimeoutDefault (2s).
	PublishTimeout time.Duration
	// RuntimeCacheTTL is how long the runtime registry read from Redis is
	// reused, so the submit path does not read it every request. A runtime
	// not in the cached copy triggers an early re-read. Default 2s.
	RuntimeCacheTTL time.Duration
	// RetryAfter is the Retry-After given with 503 answers. Default 2s.
	RetryAfter time.Duration
	// QueueFullRetryAfter is the Retry-After given with 429 (queue full). Default 5s.
	QueueFullRetryAfter time.Duration
	// Logger receives the server's log lines. Default: discard.
	Logger *slog.Logger
	// TracerProvider creates the submit spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context of requests and writes it into NATS
	// headers. Default propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator
	// Metrics counts submissions and cache hits and misses. Default: none.
	Metrics *ktrace.Metrics
	// Callbacks checks a job's callback_url when it is submitted (normally a
	// callback.Policy). Default nil: jobs naming a callback_url are refused.
	Callbacks CallbackChecker
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
	} {
		if f.v < 0 {
			return fmt.Errorf("producer config: %s is negative; use a positive value or 0 for the default", f.name)
		}
	}
	for k, name := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("producer config: API key named %q is empty", name)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Policy == (job.Policy{}) {
		c.Policy = job.DefaultPolicy()
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, job.MaxSpecJSONSize)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.RuntimeCacheTTL = cmp.Or(c.RuntimeCacheTTL, RuntimeCacheTTLDefault)
	c.RetryAfter = cmp.Or(c.RetryAfter, RetryAfterDefault)
	c.QueueFullRetryAfter = cmp.Or(c.QueueFullRetryAfter, QueueFullRetryDefault)
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
