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

// streamWriter passes every write to its capped buffer and, once the
// sandbox is armed with an output hook, to the hook.
type streamWriter struct {
	sb     *sandbox
	stream string
	buf    *cappedBuffer
}

func (w streamWriter) Write(p []byte) (int, error) {
	if tap := w.sb.tap.Load(); tap != nil {
		(*tap)(w.stream, p)
	}
	return w.buf.Write(p)
}

// outputWriters returns the writers the task's stdout and stderr go to.
func outputWriters(sb *sandbox) (io.Writer, io.Writer) {
	return streamWriter{sb, "stdout", sb.stdout}, streamWriter{sb, "stderr", sb.stderr}
}
