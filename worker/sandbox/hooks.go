package sandbox

import (
	"context"
	"io"

	"github.com/kilnrun/kiln/job"
)

// Hooks are the per-run callbacks of one Run, carried by its context (as
// net/http/httptrace carries a ClientTrace), so the Runtime interface stays
// the same for callers that want neither. The zero Hooks does nothing.
type Hooks struct {
	// Output is called with each chunk of stdout ("stdout") or stderr
	// ("stderr") as the program writes it, including bytes beyond the
	// output cap. It runs on the output copy path: it must not block.
	Output func(stream string, p []byte)
	// Store stores one collected artifact, content-addressed: ref names the
	// content's SHA-256 and size (its Tenant is left empty: the hook knows
	// whose job it is), r yields exactly ref.Size bytes. Without Store the
	// output dir is not collected and Result.Artifacts stays empty.
	Store func(ctx context.Context, ref job.ObjectRef, r io.Reader) error
}

type hooksKey struct{}

// WithHooks returns ctx carrying h for the Run it is passed to.
func WithHooks(ctx context.Context, h Hooks) context.Context {
	return context.WithValue(ctx, hooksKey{}, h)
}

func hooksFrom(ctx context.Context) Hooks {
	h, _ := ctx.Value(hooksKey{}).(Hooks)
	return h
}

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
