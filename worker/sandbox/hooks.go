package sandbox

import (
	"context"
	"io"

	"github.com/kilnrun/kiln/internal/runhooks"
)

// Hooks are the per-run callbacks (runhooks.Hooks).
type Hooks = runhooks.Hooks

// WithHooks returns ctx carrying h for the Run it is passed to.
func WithHooks(ctx context.Context, h Hooks) context.Context { return runhooks.With(ctx, h) }

func hooksFrom(ctx context.Context) Hooks { return runhooks.From(ctx) }

// tappedWriter passes every write on to w and to tap.
type tappedWriter struct {
	w      io.Writer
	stream string
	tap    func(string, []byte)
}

func (t tappedWriter) Write(p []byte) (int, error) {
	t.tap(t.stream, p)
	return t.w.Write(p)
}

// outputWriters returns the writers the task's stdout and stderr go to.
func outputWriters(h Hooks, sb *sandbox) (io.Writer, io.Writer) {
	if h.Output == nil {
		return sb.stdout, sb.stderr
	}
	return tappedWriter{sb.stdout, "stdout", h.Output}, tappedWriter{sb.stderr, "stderr", h.Output}
}
