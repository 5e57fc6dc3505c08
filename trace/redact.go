package trace

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kilnrun/kiln/redact"
)

// redactingExporter redacts key-like strings (the built-in detectors of
// package redact) in span names, string attributes, event attributes and
// status descriptions before they leave the process: an error recorded on
// a span can carry a file name or a message a job wrote.
type redactingExporter struct {
	sdktrace.SpanExporter
	d *redact.Detector
}

// NewRedactingExporter wraps e.
func NewRedactingExporter(e sdktrace.SpanExporter) sdktrace.SpanExporter {
	d, _ := redact.New(nil)
	return &redactingExporter{SpanExporter: e, d: d}
}

// ExportSpans passes the spans on, redacted.
func (e *redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = e.span(s)
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

// redactedSpan overrides what carries text; the rest is the span's.
type redactedSpan struct {
	sdktrace.ReadOnlySpan
	name   string
	attrs  []attribute.KeyValue
	events []sdktrace.Event
	status sdktrace.Status
}

func (s redactedSpan) Name() string                     { return s.name }
func (s redactedSpan) Attributes() []attribute.KeyValue { return s.attrs }
func (s redactedSpan) Events() []sdktrace.Event         { return s.events }
func (s redactedSpan) Status() sdktrace.Status          { return s.status }

func (e *redactingExporter) span(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	changed := false
	str := func(v string) string {
		r, c := e.d.String(v)
		changed = changed || c != nil
		return r
	}
	attrs := func(kvs []attribute.KeyValue) []attribute.KeyValue {
		out := make([]attribute.KeyValue, len(kvs))
		for i, kv := range kvs {
			out[i] = kv
			switch kv.Value.Type() {
			case attribute.STRING:
				out[i] = kv.Key.String(str(kv.Value.AsString()))
			case attribute.STRINGSLICE:
				vs := kv.Value.AsStringSlice()
				for j := range vs {
					vs[j] = str(vs[j])
				}
				out[i] = kv.Key.StringSlice(vs)
			}
		}
		return out
	}
	r := redactedSpan{ReadOnlySpan: s, name: str(s.Name()), attrs: attrs(s.Attributes()), status: s.Status()}
	r.status.Description = str(r.status.Description)
	for _, ev := range s.Events() {
		ev.Name = str(ev.Name)
		ev.Attributes = attrs(ev.Attributes)
		r.events = append(r.events, ev)
	}
	if !changed {
		return s
	}
	return r
}
