package trace

import (
	"context"
	"io"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// Log keys under which the handler writes the active span's ids, in the
// snake_case Kiln's logs use elsewhere.
const (
	LogKeyTraceID = "trace_id"
	LogKeySpanID  = "span_id"
)

// NewLogger returns a JSON logger writing to w at level and above whose lines
// carry trace_id and span_id when logged with a context holding a span
// (logger.InfoContext(ctx, ...)).
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(NewLogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

// NewLogHandler wraps h so that each record logged with a context holding a
// valid span context gains trace_id and span_id attributes, letting an
// operator jump from a log line to the trace in Jaeger and back.
func NewLogHandler(h slog.Handler) slog.Handler {
	return &logHandler{root: h, inner: h}
}

// logHandler adds the ids at the top level of the line even after
// WithGroup, where a record's attributes would otherwise land inside the
// group and a search for trace_id would miss them.
type logHandler struct {
	// root is the wrapped handler before the first WithGroup; inner is root
	// after every WithAttrs and WithGroup.
	root, inner slog.Handler
	// afterGroup replays, on root plus the ids, what was applied to inner
	// since the first WithGroup. Empty when no group is open, the common case.
	afterGroup []func(slog.Handler) slog.Handler
}

func (h *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return h.inner.Handle(ctx, r)
	}
	ids := []slog.Attr{
		slog.String(LogKeyTraceID, sc.TraceID().String()),
		slog.String(LogKeySpanID, sc.SpanID().String()),
	}
	if len(h.afterGroup) == 0 {
		r.AddAttrs(ids...)
		return h.inner.Handle(ctx, r)
	}
	withIDs := h.root.WithAttrs(ids)
	for _, apply := range h.afterGroup {
		withIDs = apply(withIDs)
	}
	return withIDs.Handle(ctx, r)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	if len(h.afterGroup) == 0 {
		next := h.root.WithAttrs(attrs)
		return &logHandler{root: next, inner: next}
	}
	return &logHandler{
		root:       h.root,
		inner:      h.inner.WithAttrs(attrs),
		afterGroup: append(slices.Clip(h.afterGroup), func(x slog.Handler) slog.Handler { return x.WithAttrs(attrs) }),
	}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h // slog ignores empty groups; so must the replay
	}
	return &logHandler{
		root:       h.root,
		inner:      h.inner.WithGroup(name),
		afterGroup: append(slices.Clip(h.afterGroup), func(x slog.Handler) slog.Handler { return x.WithGroup(name) }),
	}
}
