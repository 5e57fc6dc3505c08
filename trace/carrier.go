package trace

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier.
//
// NATS headers are case-sensitive maps, unlike HTTP's: the W3C propagator
// writes "traceparent", but a bridge or client that canonicalises MIME
// headers forwards "Traceparent". Get therefore prefers the exact key and
// falls back to a case-insensitive match, and Set removes other spellings so
// a stale context can never shadow the fresh one.
type HeaderCarrier nats.Header

var (
	_ propagation.TextMapCarrier = HeaderCarrier(nil)
	_ propagation.ValuesGetter   = HeaderCarrier(nil)
)

// Get returns the first value for key, matching its exact spelling first and
// any other letter case second.
func (c HeaderCarrier) Get(key string) string {
	if v := c.Values(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Values returns every value for key, with Get's matching rules. The baggage
// propagator uses it to merge several baggage headers.
func (c HeaderCarrier) Values(key string) []string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return nil
}

// Set stores value under key exactly as spelled, replacing any value stored
// under another letter case of the same key.
func (c HeaderCarrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys lists the header names present.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the trace context and baggage of ctx into h using prop (the
// W3C trace-context and baggage propagator when prop is nil).
//
// h must be non-nil: a nats.Msg built as a struct literal has a nil Header, so
// create it with nats.NewMsg or set Header to nats.Header{} first. A nil h is
// left alone rather than panicking, and the consumer then starts a new trace.
func Inject(ctx context.Context, prop propagation.TextMapPropagator, h nats.Header) {
	if h == nil {
		return
	}
	if prop == nil {
		prop = newPropagator()
	}
	prop.Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx carrying the remote span context and baggage found in
// h, so that spans started from it are children of the publisher's span. A
// nil or empty h returns ctx unchanged.
func Extract(ctx context.Context, prop propagation.TextMapPropagator, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	if prop == nil {
		prop = newPropagator()
	}
	return prop.Extract(ctx, HeaderCarrier(h))
}

// newPropagator is the W3C trace-context and baggage propagator, the format
// Jaeger and every OTel SDK understand.
func newPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// InjectMap returns the trace context and baggage of ctx as a map, for a
// record that travels through a store rather than a message (a session's
// call): nil when ctx holds neither. prop as Inject's.
func InjectMap(ctx context.Context, prop propagation.TextMapPropagator) map[string]string {
	if prop == nil {
		prop = newPropagator()
	}
	m := propagation.MapCarrier{}
	prop.Inject(ctx, m)
	if len(m) == 0 {
		return nil
	}
	return m
}

// ExtractMap is Extract for a map InjectMap made. A nil or empty m returns
// ctx unchanged.
func ExtractMap(ctx context.Context, prop propagation.TextMapPropagator, m map[string]string) context.Context {
	if len(m) == 0 {
		return ctx
	}
	if prop == nil {
		prop = newPropagator()
	}
	return prop.Extract(ctx, propagation.MapCarrier(m))
}
