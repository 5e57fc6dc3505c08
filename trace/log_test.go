package trace

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func decodeLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLoggerAddsTraceIDs(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	var buf bytes.Buffer
	logger := NewLogger(&buf, slog.LevelInfo).With(slog.String("component", "worker"))

	ctx, span := tp.Tracer("kiln/test").Start(t.Context(), SpanExecute)
	defer span.End()
	logger.InfoContext(ctx, "job started", slog.String("job_id", "j1"))
	logger.WithGroup("sandbox").InfoContext(ctx, "container created", slog.String("id", "c1"))
	logger.InfoContext(t.Context(), "no span here")
	logger.DebugContext(ctx, "below the level")

	lines := decodeLines(t, &buf)
	if len(lines) != 3 {
		t.Fatalf("got %d lines; want 3 (debug suppressed): %s", len(lines), buf.String())
	}
	wantTrace, wantSpan := span.SpanContext().TraceID().String(), span.SpanContext().SpanID().String()
	for _, l := range lines[:2] {
		if l["trace_id"] != wantTrace || l["span_id"] != wantSpan {
			t.Errorf("line %v: want top-level trace_id %s span_id %s", l, wantTrace, wantSpan)
		}
		if l["component"] != "worker" {
			t.Errorf("line %v lost the logger's attribute", l)
		}
	}
	if lines[0]["job_id"] != "j1" {
		t.Errorf("line %v lost its own attribute", lines[0])
	}
	if g, _ := lines[1]["sandbox"].(map[string]any); g["id"] != "c1" || g["trace_id"] != nil {
		t.Errorf("grouped line %v: want id inside the group and the trace ids outside it", lines[1])
	}
	if _, ok := lines[2]["trace_id"]; ok {
		t.Errorf("line without a span has trace_id: %v", lines[2])
	}
}
