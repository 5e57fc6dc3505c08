package trace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/otlptest"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

// otelEnv is every variable Setup or the SDK reads; tests clear them all so
// the developer's shell cannot change what a test proves.
var otelEnv = []string{
	"OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
	"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
	"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
}

// clearEnv unsets every OTEL variable for the test and restores it after.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range otelEnv {
		t.Setenv(k, "") // registers the restore
		os.Unsetenv(k)
	}
}

func setup(t *testing.T, cfg Config) *Providers {
	t.Helper()
	p, err := Setup(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx) // tests that care shut down themselves; this one is idempotent
	})
	return p
}

func shutdown(t *testing.T, p *Providers) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// spansByName is what rec received, by span name (the last of each name).
func spansByName(rec *otlptest.Receiver) map[string]otlptest.Span {
	out := map[string]otlptest.Span{}
	for _, s := range rec.Spans() {
		out[s.GetName()] = s
	}
	return out
}

// makeJobSpans emits a submit span with a queue child and returns both span contexts.
func makeJobSpans(ctx context.Context, p *Providers) (parent, child trace.SpanContext) {
	tracer := p.TracerProvider().Tracer("kiln/test")
	ctx, submit := tracer.Start(ctx, SpanSubmit, trace.WithAttributes(JobIDKey.String("job-1"), RuntimeKey.String("python")))
	_, queue := tracer.Start(ctx, SpanQueue, trace.WithAttributes(LimitAttrs(job.DefaultLimits)...))
	queue.End()
	submit.End()
	return submit.SpanContext(), queue.SpanContext()
}

func checkExported(t *testing.T, rec *otlptest.Receiver, parent, child trace.SpanContext, wantResource map[string]string) {
	t.Helper()
	got := spansByName(rec)
	submit, ok := got[SpanSubmit]
	if !ok {
		t.Fatalf("receiver has spans %v; want %q", keys(got), SpanSubmit)
	}
	queue, ok := got[SpanQueue]
	if !ok {
		t.Fatalf("receiver has spans %v; want %q", keys(got), SpanQueue)
	}
	if tid := parent.TraceID(); !bytes.Equal(submit.Span.GetTraceId(), tid[:]) || !bytes.Equal(queue.Span.GetTraceId(), tid[:]) {
		t.Errorf("exported trace ids %x, %x; want both %s", submit.Span.GetTraceId(), queue.Span.GetTraceId(), tid)
	}
	if sid := parent.SpanID(); !bytes.Equal(queue.Span.GetParentSpanId(), sid[:]) {
		t.Errorf("queue span's parent is %x; want the submit span %s", queue.Span.GetParentSpanId(), sid)
	}
	if sid := child.SpanID(); !bytes.Equal(queue.Span.GetSpanId(), sid[:]) {
		t.Errorf("queue span id %x; want %s", queue.Span.GetSpanId(), sid)
	}
	if got := submit.Attrs[string(JobIDKey)]; got != "job-1" {
		t.Errorf("submit span %s = %q; want job-1", JobIDKey, got)
	}
	if got := queue.Attrs[string(LimitMemoryMBKey)]; got != fmt.Sprint(job.DefaultLimits.MemoryMB) {
		t.Errorf("queue span %s = %q; want %d", LimitMemoryMBKey, got, job.DefaultLimits.MemoryMB)
	}
	for k, want := range wantResource {
		if got := submit.Resource[k]; got != want {
			t.Errorf("resource %s = %q; want %q (resource: %v)", k, got, want, submit.Resource)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatalf("hostname: %v", err)
	}
	return h
}

// TestSetupExportsOverOTLPHTTP proves spans reach a real OTLP/HTTP endpoint,
// via both the base endpoint variable (the exporter appends /v1/traces) and
// the per-signal one (used as written), with the resource Kiln promises.
func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	for _, tc := range []struct {
		name, envVar, path, wantPath string
	}{
		{"base endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "", "/v1/traces"},
		{"traces endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/collector/spans", "/collector/spans"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			rec, url := otlptest.NewHTTP(t)
			t.Setenv(tc.envVar, url+tc.path)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test,kiln.region=eu-1")

			p := setup(t, Config{ServiceName: "kiln-api", ServiceVersion: "1.2.3"})
			parent, child := makeJobSpans(t.Context(), p)
			shutdown(t, p)

			checkExported(t, rec, parent, child, map[string]string{
				"service.name":                "kiln-api",
				"service.version":             "1.2.3",
				"host.name":                   hostname(t),
				"kiln.region":                 "eu-1",
				"deployment.environment.name": "test",
			})
			for _, p := range rec.Paths() {
				if p != tc.wantPath {
					t.Errorf("export posted to %q; want %q", p, tc.wantPath)
				}
			}
		})
	}
}

// TestSetupExportsOverOTLPGRPC proves the grpc protocol choice reaches a real
// OTLP/gRPC TraceService, and that OTEL_SERVICE_NAME beats Config.ServiceName.
func TestSetupExportsOverOTLPGRPC(t *testing.T) {
	clearEnv(t)
	rec, addr := otlptest.NewGRPC(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_SERVICE_NAME", "kiln-worker-blue")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "kiln.region=us-2")

	p := setup(t, Config{ServiceName: "kiln-worker", ServiceVersion: "2.0.0"})
	parent, child := makeJobSpans(t.Context(), p)
	shutdown(t, p)

	checkExported(t, rec, parent, child, map[string]string{
		"service.name":    "kiln-worker-blue",
		"service.version": "2.0.0",
		"host.name":       hostname(t),
		"kiln.region":     "us-2",
	})
}

// TestSetupSamplerFromEnv proves OTEL_TRACES_SAMPLER is honoured: nothing is
// exported, yet spans still have trace ids the API can hand out.
func TestSetupSamplerFromEnv(t *testing.T) {
	clearEnv(t)
	rec, url := otlptest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")

	p := setup(t, Config{ServiceName: "kiln-api"})
	parent, _ := makeJobSpans(t.Context(), p)
	shutdown(t, p)

	if !parent.TraceID().IsValid() {
		t.Errorf("unsampled span has no trace id")
	}
	if got := spansByName(rec); len(got) != 0 {
		t.Errorf("always_off sampler exported %v", keys(got))
	}
}

// TestSetupCollectorDown proves a dead collector never stalls the code that
// ends spans, and Shutdown gives up at its deadline.
func TestSetupCollectorDown(t *testing.T) {
	for _, tc := range []struct {
		name, protocol string
		collector      func(t *testing.T) string // returns the endpoint address
	}{
		{"refused/http", ProtocolHTTPProtobuf, closedPort},
		{"refused/grpc", ProtocolGRPC, closedPort},
		{"hung/http", ProtocolHTTPProtobuf, hungCollector},
		{"hung/grpc", ProtocolGRPC, hungCollector},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+tc.collector(t))
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")
			p := setup(t, Config{ServiceName: "kiln-worker", ExportTimeout: 30 * time.Second})

			tracer := p.TracerProvider().Tracer("kiln/test")
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range 10_000 {
					_, span := tracer.Start(t.Context(), SpanExecute, trace.WithAttributes(AttemptKey.Int(i)))
					span.End()
				}
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("ending 10,000 spans with the collector down did not finish within 5s (export timeout is 30s): span end blocks on export")
			}

			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			shut := make(chan error, 1)
			start := time.Now()
			go func() { shut <- p.Shutdown(ctx) }()
			select {
			case err := <-shut:
				t.Logf("Shutdown returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Shutdown: %v; want nil or the deadline", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("Shutdown with a 1s context still running after 3s")
			}
		})
	}
}

// closedPort is an address nothing listens on: connections are refused.
func closedPort(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
}

// hungCollector accepts connections and never answers, the worst case for a
// caller that waits on export: only a timeout ends each request.
func hungCollector(t *testing.T) string {
	addr, _ := otlptest.NewHung(t)
	return addr
}

// connCounter counts connections accepted on a listener.
type connCounter struct {
	lis      net.Listener
	accepted atomic.Int64
	marker   chan struct{}
}

func listenCounting(t *testing.T, network, addr string) *connCounter {
	t.Helper()
	lis, err := net.Listen(network, addr)
	if err != nil {
		return nil
	}
	c := &connCounter{lis: lis, marker: make(chan struct{}, 1)}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			if _, err := conn.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
				// Our own marker closes without writing; anything else is an exporter.
				select {
				case c.marker <- struct{}{}:
				default:
				}
			} else {
				c.accepted.Add(1)
			}
			conn.Close()
		}
	}()
	t.Cleanup(func() { lis.Close() })
	return c
}

// drained dials the listener and waits for that connection to be accepted:
// the accept queue is first in, first out, so any earlier connection has
// been counted by then.
func (c *connCounter) drained(t *testing.T) int64 {
	t.Helper()
	conn, err := net.Dial(c.lis.Addr().Network(), c.lis.Addr().String())
	if err != nil {
		t.Fatalf("dial marker: %v", err)
	}
	conn.Close()
	select {
	case <-c.marker:
	case <-time.After(5 * time.Second):
		t.Fatal("marker connection not accepted")
	}
	return c.accepted.Load()
}

// TestSetupWithoutEndpoint proves that with no OTEL variables nothing is
// exported, not even to the specification's default localhost ports, while
// spans still carry valid trace ids for the API to return.
func TestSetupWithoutEndpoint(t *testing.T) {
	clearEnv(t)
	var counters []*connCounter
	for _, addr := range []string{"127.0.0.1:4318", "127.0.0.1:4317", "[::1]:4318", "[::1]:4317"} {
		if c := listenCounting(t, "tcp", addr); c != nil {
			counters = append(counters, c)
		} else {
			t.Logf("%s is taken; relying on the exporter check for it", addr)
		}
	}

	p := setup(t, Config{ServiceName: "kiln-api"})
	if p.exporter != nil {
		t.Fatal("Setup created a span exporter with no endpoint configured")
	}
	parent, child := makeJobSpans(t.Context(), p)
	if !parent.IsValid() || !child.IsValid() || parent.TraceID() != child.TraceID() {
		t.Errorf("span contexts %v / %v: want valid ids in one trace", parent, child)
	}
	shutdown(t, p)
	for _, c := range counters {
		if n := c.drained(t); n != 0 {
			t.Errorf("%d connection(s) reached %s", n, c.lis.Addr())
		}
	}
}

// TestSetupDisabled proves OTEL_SDK_DISABLED=true turns exporting off even
// with an endpoint set, while an incoming trace context still passes through.
func TestSetupDisabled(t *testing.T) {
	clearEnv(t)
	rec, url := otlptest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
	t.Setenv("OTEL_SDK_DISABLED", "TRUE")

	p := setup(t, Config{ServiceName: "kiln-api"})
	remote := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := Extract(t.Context(), p.Propagator(), nats.Header{"traceparent": {remote}})
	_, span := p.TracerProvider().Tracer("kiln/test").Start(ctx, SpanExecute)
	span.End()
	if got := span.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("disabled SDK lost the incoming trace id: got %q", got)
	}
	_, own := p.TracerProvider().Tracer("kiln/test").Start(t.Context(), SpanSubmit)
	own.End()
	if own.SpanContext().IsValid() {
		t.Errorf("disabled SDK created a trace id")
	}
	shutdown(t, p)
	if got := spansByName(rec); len(got) != 0 {
		t.Errorf("disabled SDK exported %v", keys(got))
	}
}

// TestSetupRejectsBadConfig proves configuration mistakes fail at start-up.
func TestSetupRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		cfg  Config
	}{
		{"json protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, Config{}},
		{"unknown traces protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, Config{}},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, Config{}},
		{"bad resource attributes", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "no-equals-sign"}, Config{}},
		{"negative queue", nil, Config{MaxQueueSize: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, err := Setup(t.Context(), tc.cfg)
			if err == nil {
				_ = p.Shutdown(t.Context())
				t.Fatal("Setup succeeded; want an error")
			}
		})
	}
}

// TestShutdownIdempotent proves a second Shutdown is harmless and spans ended
// after it are not exported.
func TestShutdownIdempotent(t *testing.T) {
	clearEnv(t)
	rec, url := otlptest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
	p := setup(t, Config{})
	shutdown(t, p)
	shutdown(t, p)
	makeJobSpans(t.Context(), p)
	if got := spansByName(rec); len(got) != 0 {
		t.Errorf("spans after Shutdown were exported: %v", keys(got))
	}
}
