package worker

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/kilnrun/kiln/worker/egress"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/redact"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Config configures a Worker. Zero fields take the default named beside them.
type Config struct {
	// ID names this worker in results, logs and container labels. Keep it
	// stable across restarts so a restarted worker reaps what its crashed
	// predecessor left; one live process per id (see IDLease). Default: the
	// host name.
	ID string
	// Runtime is the sandbox backend jobs and sessions run on. Required.
	Runtime Sandboxes
	// Store holds job records and results. Required.
	Store Store
	// NATS is the connection to the JetStream server. Required.
	NATS *nats.Conn
	// Queue sizes the stream and consumer. The API owns the stream: a worker
	// creates it only when missing and logs any difference at ERROR. The
	// consumer is created by the first worker and updated only by a
	// QueueOwner.
	Queue queue.Config
	// Blob sizes the object store bucket of artifacts and large inputs; it
	// must match the producers'. Zero fields take blob's defaults.
	Blob blob.Config
	// Events sizes the stream retaining live events; it must match the
	// producers'. Zero fields take events' defaults.
	Events events.Config
	// QueueOwner makes this worker apply its consumer settings (AckWait,
	// MaxDeliver) to an existing consumer instead of only verifying them.
	// Start one worker with it to change them. Default: false.
	QueueOwner bool
	// Concurrency is how many jobs run at once. Default: runtime.NumCPU().
	Concurrency int
	// Sessions configures the sessions this worker holds (session.go),
	// when its Runtime hosts them (Sandboxes.HostsSessions).
	Sessions SessionConfig
	// DrainTimeout is how long running jobs may go on after shutdown starts;
	// jobs still running then are killed and handed back. Default: 2m.
	DrainTimeout time.Duration
	// Heartbeat is the interval of InProgress acks, and of renewals of the
	// job's lease in the store, while a job runs. The lease lasts AckWait, so
	// keep Heartbeat well below it. Default: AckWait/3.
	Heartbeat time.Duration
	// RegistryInterval is how often the runtime registry entry is refreshed
	// (it expires after three intervals). Default: 10s.
	RegistryInterval time.Duration
	// IDLease is how long the worker id's lease in the store lasts unless
	// renewed (every IDLease/3). A worker started with an id whose lease is
	// live waits this long for it to lapse, then refuses to start; a dead
	// worker's sandboxes are reaped once it lapses. Default: 10s.
	IDLease time.Duration
	// SweepInterval is how often the worker removes this host's sandboxes
	// that outlived their wall-clock limit or whose worker's lease lapsed
	// (Sandboxes.ReapExpired). Default: 1s.
	SweepInterval time.Duration
	// StoreProbe is how often a worker whose store failed PINGs it; the
	// first answer resumes pulls. Default: 500ms.
	StoreProbe time.Duration
	// SandboxProbe is how often the worker asks its sandbox backend whether
	// it answers (Sandboxes.Healthy, unless unsupported); while it does not, the
	// worker pulls no job. Default: 1s.
	SandboxProbe time.Duration
	// WriteProbe is how often the worker writes a probe message to
	// JetStream's store (queue.Config.ProbeWrite); /readyz fails while the
	// write fails. Default: 5s.
	WriteProbe time.Duration
	// Logger receives structured logs. Default: slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the queue and execute spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from NATS headers. Default: W3C trace context.
	Propagator propagation.TextMapPropagator
	// Metrics records job counters and slot gauges; nil records nothing.
	Metrics *ktrace.Metrics
	// EgressTestHosts, for tests only, replaces DNS in every job's egress
	// proxy with a fixed table (egress.TestHosts); nil: real DNS.
	EgressTestHosts *egress.TestHosts
	// Clock is the worker's one clock: its schedules against the store
	// (hooks.go: registry refreshes, waiting for a held worker id, judging
	// a sandbox's worker gone), the times it records (a run's start and
	// end, audit records) and judges quotas and budgets by, and the
	// sessions' (SessionConfig.Now, unless set). Network deadlines,
	// waits and latencies are the wall clock's. Default: the wall clock.
	Clock Clock
	// Hooks signal what the worker does (hooks.go), for tests to wait on.
	// Default: none.
	Hooks Hooks
}

// DrainTimeoutDefault and friends are the defaults of Config.
const (
	DrainTimeoutDefault     = 2 * time.Minute
	RegistryIntervalDefault = 10 * time.Second
	StoreProbeDefault       = 500 * time.Millisecond
	SandboxProbeDefault     = time.Second
	WriteProbeDefault       = 5 * time.Second
	IDLeaseDefault          = 10 * time.Second
	SweepIntervalDefault    = time.Second
)

func (c Config) withDefaults() Config {
	if c.ID == "" {
		c.ID, _ = os.Hostname()
		c.ID = cmp.Or(c.ID, "worker")
	}
	c.Concurrency = cmp.Or(c.Concurrency, runtime.NumCPU())
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DrainTimeoutDefault)
	c.Queue.MaxDeliver = cmp.Or(c.Queue.MaxDeliver, queue.DefaultMaxDeliver)
	c.Queue.AckWait = cmp.Or(c.Queue.AckWait, queue.DefaultAckWait)
	c.Heartbeat = cmp.Or(c.Heartbeat, c.Queue.AckWait/3)
	c.RegistryInterval = cmp.Or(c.RegistryInterval, RegistryIntervalDefault)
	c.StoreProbe = cmp.Or(c.StoreProbe, StoreProbeDefault)
	c.SandboxProbe = cmp.Or(c.SandboxProbe, SandboxProbeDefault)
	c.WriteProbe = cmp.Or(c.WriteProbe, WriteProbeDefault)
	c.IDLease = cmp.Or(c.IDLease, IDLeaseDefault)
	c.SweepInterval = cmp.Or(c.SweepInterval, SweepIntervalDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	// No log line of the worker carries a key a job printed (redact.go).
	c.Logger = slog.New(redact.NewHandler(c.Logger.Handler()))
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

// Validate reports a configuration the worker cannot start with.
func (c Config) Validate() error {
	var errs []error
	if c.Runtime == nil {
		errs = append(errs, errors.New("worker: Runtime is required"))
	}
	if c.Store == nil {
		errs = append(errs, errors.New("worker: Store is required"))
	}
	if c.NATS == nil {
		errs = append(errs, errors.New("worker: NATS connection is required"))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("worker: Concurrency %d must be positive", c.Concurrency))
	}
	if err := c.Queue.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("worker: %w", err))
	}
	return errors.Join(errs...)
}
