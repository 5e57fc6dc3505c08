package redact

import (
	"context"
	"log/slog"
)

// Handler is a slog.Handler that redacts messages and string, error and
// Stringer attribute values with the built-in detectors before passing the
// record on: a key a program printed cannot reach a log line through an
// error or a file name.
type Handler struct {
	next slog.Handler
	d    *Detector
}

// NewHandler wraps next. Wrapping a Handler again returns it unchanged.
func NewHandler(next slog.Handler) slog.Handler {
	if _, ok := next.(*Handler); ok {
		return next
	}
	d, _ := New(nil)
	return &Handler{next: next, d: d}
}

// Enabled reports whether the wrapped handler logs at l.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle redacts r and passes it on.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	msg, _ := h.d.String(r.Message)
	out := slog.NewRecord(r.Time, r.Level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs redacts attrs once, as they are bound.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &Handler{next: h.next.WithAttrs(red), d: h.d}
}

// WithGroup opens a group on the wrapped handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), d: h.d}
}

func (h *Handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s, c := h.d.String(v.String()); c != nil {
			return slog.String(a.Key, s)
		}
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, x := range g {
			red[i] = h.attr(x)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		var s string
		switch x := v.Any().(type) {
		case error:
			s = x.Error()
		case interface{ String() string }:
			s = x.String()
		default:
			return slog.Attr{Key: a.Key, Value: v}
		}
		if r, c := h.d.String(s); c != nil {
			return slog.String(a.Key, r)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
