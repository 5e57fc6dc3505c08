package trace

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/testenv"
)

func TestHeaderCarrier(t *testing.T) {
	t.Parallel()
	h := nats.Header{}
	c := HeaderCarrier(h)

	c.Set("traceparent", "a")
	if got := h["traceparent"]; !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Set stored %v under traceparent; want [a] under the exact key", h)
	}
	if got := c.Get("traceparent"); got != "a" {
		t.Errorf("Get(traceparent) = %q; want a", got)
	}

	canonical := HeaderCarrier(nats.Header{"Traceparent": {"b"}})
	if got := canonical.Get("traceparent"); got != "b" {
		t.Errorf("Get(traceparent) on a canonicalised header = %q; want b", got)
	}
	canonical.Set("traceparent", "c")
	if _, stale := canonical["Traceparent"]; stale || canonical.Get("traceparent") != "c" {
		t.Errorf("Set kept a stale spelling: %v", canonical)
	}

	if got := c.Get("tracestate"); got != "" {
		t.Errorf("Get of a missing key = %q; want empty", got)
	}
	h.Set("Kiln-Job-Id", "j")
	if got := c.Keys(); !slices.Contains(got, "traceparent") || !slices.Contains(got, "Kiln-Job-Id") || len(got) != 2 {
		t.Errorf("Keys() = %v", got)
	}
}

// TestPropagationOverNATS proves a consumer's span becomes the child of the
// producer's span after the context travels in real NATS message headers,
// both as written by Inject and as rewritten by a peer that capitalises
// header names.
func TestPropagationOverNATS(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	tracer := tp.Tracer("kiln/test")
	prop := newPropagator()

	for _, tc := range []struct {
		name     string
		rewrite  func(nats.Header) // what a peer does to the headers before they hit the wire
		wantWire string            // header key seen by the consumer
	}{
		{"as written", func(nats.Header) {}, "traceparent"},
		{"canonicalised", func(h nats.Header) {
			v := h["traceparent"]
			delete(h, "traceparent")
			h["Traceparent"] = v
		}, "Traceparent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			subject := "kiln.test.propagation"
			sub, err := nc.SubscribeSync(subject)
			if err != nil {
				t.Fatalf("subscribe: %v", err)
			}
			defer sub.Unsubscribe()

			member, _ := baggage.NewMember("kiln.job.id", "job-42")
			bag, _ := baggage.New(member)
			ctx := baggage.ContextWithBaggage(t.Context(), bag)
			ctx, submit := tracer.Start(ctx, SpanSubmit, trace.WithSpanKind(trace.SpanKindProducer))
			msg := nats.NewMsg(subject)
			Inject(ctx, prop, msg.Header)
			tc.rewrite(msg.Header)
			if err := nc.PublishMsg(msg); err != nil {
				t.Fatalf("publish: %v", err)
			}
			submit.End()

			got, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			if _, ok := got.Header[tc.wantWire]; !ok {
				t.Fatalf("received headers %v; want key %q", got.Header, tc.wantWire)
			}
			consumerCtx := Extract(t.Context(), prop, got.Header)
			if v := baggage.FromContext(consumerCtx).Member("kiln.job.id").Value(); v != "job-42" {
				t.Errorf("baggage kiln.job.id = %q after the trip; want job-42", v)
			}
			_, execute := tracer.Start(consumerCtx, SpanExecute, trace.WithSpanKind(trace.SpanKindConsumer))
			execute.End()

			spans := exp.GetSpans()
			if len(spans) != 2 {
				t.Fatalf("exported %d spans; want 2", len(spans))
			}
			producer, consumer := spans[0], spans[1]
			if producer.Name != SpanSubmit || consumer.Name != SpanExecute {
				t.Fatalf("spans %q, %q; want %q then %q", producer.Name, consumer.Name, SpanSubmit, SpanExecute)
			}
			if consumer.SpanContext.TraceID() != producer.SpanContext.TraceID() {
				t.Errorf("consumer trace %s; want the producer's %s", consumer.SpanContext.TraceID(), producer.SpanContext.TraceID())
			}
			if consumer.Parent.SpanID() != producer.SpanContext.SpanID() || !consumer.Parent.IsRemote() {
				t.Errorf("consumer parent %s (remote %v); want the producer span %s, remote",
					consumer.Parent.SpanID(), consumer.Parent.IsRemote(), producer.SpanContext.SpanID())
			}
		})
	}
}

func TestExtractWithoutHeaders(t *testing.T) {
	t.Parallel()
	ctx := Extract(t.Context(), nil, nil)
	if trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("Extract from nil headers produced a span context")
	}
	Inject(t.Context(), nil, nil) // must not panic on a nats.Msg without headers
}

// A session call's trace context travels in its stored record as a map:
// what InjectMap writes, ExtractMap reads back as the parent of the
// worker's span; a context without a span writes nothing.
func TestTraceContextInAMap(t *testing.T) {
	t.Parallel()
	if m := InjectMap(t.Context(), nil); m != nil {
		t.Errorf("InjectMap without a span: %v; want nil", m)
	}
	if ctx := ExtractMap(t.Context(), nil, nil); trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("ExtractMap of nil produced a span context")
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "session.call")
	m := InjectMap(ctx, nil)
	if m["traceparent"] == "" {
		t.Fatalf("InjectMap: %v; want a traceparent", m)
	}
	_, child := tp.Tracer("test").Start(ExtractMap(t.Context(), nil, m), "execute")
	child.End()
	parent.End()
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].Parent.SpanID() != parent.SpanContext().SpanID() ||
		spans[0].SpanContext.TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("the span started from the map is not the child of the injected one: %+v", spans)
	}
}
