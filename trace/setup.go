package trace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Defaults applied by Setup to zero Config fields.
const (
	// ServiceNameDefault is service.name when neither OTEL_SERVICE_NAME,
	// OTEL_RESOURCE_ATTRIBUTES nor Config.ServiceName names the service.
	ServiceNameDefault = "kiln"
	// ServiceVersionDefault is service.version when Config.ServiceVersion is
	// empty and the binary carries no module version.
	ServiceVersionDefault = "unknown"
)

// Protocols accepted in OTEL_EXPORTER_OTLP_PROTOCOL and
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf" // the default, as the OTLP specification says
)

// instrumentationName is the scope name of Kiln's tracers and meters.
const instrumentationName = "github.com/kilnrun/kiln"

// Config is what the binary knows that the environment does not. Everything
// else (endpoint, protocol, headers, TLS, sampler, resource attributes) comes
// from the standard OTEL_* variables so operators configure Kiln the same way
// as any other OpenTelemetry service.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME or a service.name
	// in OTEL_RESOURCE_ATTRIBUTES overrides it, e.g. "kiln-api" or
	// "kiln-worker". Default ServiceNameDefault.
	ServiceName string
	// ServiceVersion is service.version unless OTEL_RESOURCE_ATTRIBUTES sets
	// it. Default: the main module's version from the build info, or
	// ServiceVersionDefault.
	ServiceVersion string
	// MaxQueueSize bounds the spans waiting for export. When the collector is
	// slow or down and the queue is full, new spans are dropped instead of
	// blocking the job that ended them. Default: OTEL_BSP_MAX_QUEUE_SIZE, or
	// 2048.
	MaxQueueSize int
	// ExportTimeout bounds one batch export including the exporter's retries.
	// Default: OTEL_BSP_EXPORT_TIMEOUT, or 30s. The per-request timeout is
	// OTEL_EXPORTER_OTLP_TIMEOUT (10s by default).
	ExportTimeout time.Duration
}

// Validate reports a Config that Setup cannot use.
func (c Config) Validate() error {
	if c.MaxQueueSize < 0 {
		return fmt.Errorf("trace config: MaxQueueSize is %d; it must be positive (or 0 for the default)", c.MaxQueueSize)
	}
	if c.ExportTimeout < 0 {
		return fmt.Errorf("trace config: ExportTimeout is %s; it must be positive (or 0 for the default)", c.ExportTimeout)
	}
	return nil
}

// Providers holds one process's telemetry pipeline. Create it with Setup and
// end it with Shutdown.
type Providers struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagator     propagation.TextMapPropagator
	metricsHandler http.Handler

	// The SDK providers, nil when OTEL_SDK_DISABLED=true.
	sdkTracer *sdktrace.TracerProvider
	sdkMeter  *sdkmetric.MeterProvider
	// exporter is nil when no OTLP endpoint is configured.
	exporter *abortableExporter

	shutdownOnce sync.Once
	shutdownErr  error
}

// Setup builds the tracer and meter providers from cfg and the environment:
//
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT: where
//     spans go. When neither is set, or OTEL_TRACES_EXPORTER=none, nothing is
//     exported and no connection is ever made; spans are still created by the
//     SDK, so trace ids exist for the API to return and for logs to carry.
//     (The specification's fallback to localhost:4318 is deliberately not
//     applied: a dev run without a collector should not retry a dead port.)
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL:
//     "http/protobuf" (default) or "grpc". The OTLP exporters also read the
//     other OTEL_EXPORTER_OTLP_* variables (headers, TLS, timeout, compression).
//   - OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: override the resource,
//     which otherwise has service.name and service.version from cfg and
//     host.name from the kernel.
//   - OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG: the sampler (default
//     parentbased_always_on), read by the SDK.
//   - OTEL_SDK_DISABLED=true: no-op tracer and meter providers. Spans then
//     carry no trace id of their own, but an incoming context is still
//     propagated, and the metrics handler serves an empty page.
//
// Spans reach the exporter through a batch processor with a bounded queue
// that drops when full, so a slow or unreachable collector never blocks job
// processing. Metrics are not pushed: MetricsHandler serves them for
// Prometheus to scrape.
func Setup(ctx context.Context, cfg Config) (*Providers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// A registry of our own, not prometheus.DefaultRegisterer, so two
	// Providers in one process (tests, the all-in-one dev mode) never clash.
	reg := prometheus.NewRegistry()
	p := &Providers{
		propagator:     newPropagator(),
		metricsHandler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
	}
	if sdkDisabled() {
		p.tracerProvider = tracenoop.NewTracerProvider()
		p.meterProvider = metricnoop.NewMeterProvider()
		return p, nil
	}

	res, err := newResource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	exp, err := newSpanExporter(ctx)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process collector: %w", err)
	}
	// Without the otel_scope_* labels: every kiln_* metric is one scope's,
	// and the exporter would put an empty otel_scope_version and
	// otel_scope_schema_url on every series.
	promExp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("create prometheus exporter: %w", err)
	}

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exp != nil {
		p.exporter = newAbortableExporter(NewRedactingExporter(exp))
		tpOpts = append(tpOpts, sdktrace.WithBatcher(p.exporter, batchOptions(cfg)...))
	}
	p.sdkTracer = sdktrace.NewTracerProvider(tpOpts...)
	p.sdkMeter = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(promExp))
	p.tracerProvider = p.sdkTracer
	p.meterProvider = p.sdkMeter
	return p, nil
}

// TracerProvider returns the tracer provider; name tracers with the package
// that starts the spans.
func (p *Providers) TracerProvider() trace.TracerProvider { return p.tracerProvider }

// MeterProvider returns the meter provider; pass it to NewMetrics.
func (p *Providers) MeterProvider() metric.MeterProvider { return p.meterProvider }

// Propagator returns the W3C trace-context and baggage propagator to use with
// Inject and Extract.
func (p *Providers) Propagator() propagation.TextMapPropagator { return p.propagator }

// MetricsHandler serves every instrument of MeterProvider, plus Go runtime and
// process metrics, in the Prometheus text format. Mount it at /metrics.
func (p *Providers) MetricsHandler() http.Handler { return p.metricsHandler }

// Shutdown exports the spans still queued and stops the providers, giving up
// when ctx ends: an export still in flight at that moment is abandoned rather
// than left retrying in the background. Spans ended afterwards are dropped.
// Calling it again returns the first call's result.
func (p *Providers) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		if p.exporter != nil {
			// The SDK's batch processor returns at ctx's deadline but keeps
			// draining its queue on a background context, each batch allowed
			// the full export timeout; aborting ties those exports to ctx.
			stop := context.AfterFunc(ctx, p.exporter.abort)
			defer stop()
			defer p.exporter.abort()
		}
		var errs []error
		if p.sdkTracer != nil {
			if err := p.sdkTracer.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("shut down tracer provider: %w", err))
			}
		}
		if p.sdkMeter != nil {
			if err := p.sdkMeter.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("shut down meter provider: %w", err))
			}
		}
		p.shutdownErr = errors.Join(errs...)
	})
	return p.shutdownErr
}

// newResource describes this process. Later sources win: cfg, then the host,
// then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, so an operator can
// always override what the binary says about itself.
func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(
			ServiceNameKey.String(cmp.Or(cfg.ServiceName, ServiceNameDefault)),
			ServiceVersionKey.String(cmp.Or(cfg.ServiceVersion, buildVersion(), ServiceVersionDefault)),
		),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(),
	)
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES is an operator mistake best
		// reported at start-up, not discovered later as missing attributes.
		return nil, fmt.Errorf("build telemetry resource: %w", err)
	}
	return res, nil
}

// buildVersion is the main module's version when the binary was built from a
// tagged module ("go install ...@v1.2.3"), else "".
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Main.Version == "" || info.Main.Version == "(devel)" {
		return ""
	}
	return info.Main.Version
}

// newSpanExporter returns the OTLP exporter the environment asks for, or nil
// when no endpoint is configured. Neither exporter dials here: connections are
// made on the first export, so Setup never waits for a collector.
func newSpanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	switch exporters := env("OTEL_TRACES_EXPORTER"); exporters {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only \"otlp\" and \"none\" are supported", exporters)
	}
	if env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && env("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, nil
	}
	protocol := cmp.Or(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL"), ProtocolHTTPProtobuf)
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case ProtocolHTTPProtobuf:
		exp, err = otlptracehttp.New(ctx)
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTLP protocol %q: supported are %q and %q", protocol, ProtocolHTTPProtobuf, ProtocolGRPC)
	}
	if err != nil {
		return nil, fmt.Errorf("create OTLP %s span exporter: %w", protocol, err)
	}
	return exp, nil
}

// batchOptions passes on only the fields cfg sets, so that the OTEL_BSP_*
// variables the SDK reads stay in effect otherwise.
func batchOptions(cfg Config) []sdktrace.BatchSpanProcessorOption {
	var opts []sdktrace.BatchSpanProcessorOption
	if cfg.MaxQueueSize > 0 {
		opts = append(opts, sdktrace.WithMaxQueueSize(cfg.MaxQueueSize))
	}
	if cfg.ExportTimeout > 0 {
		opts = append(opts, sdktrace.WithExportTimeout(cfg.ExportTimeout))
	}
	return opts
}

// sdkDisabled follows the specification: only "true", in any case, disables.
func sdkDisabled() bool { return strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") }

// env treats an empty variable like an unset one, as the OTLP exporters do.
func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }
