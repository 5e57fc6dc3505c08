package sandbox

import (
	"context"
	"io"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// Request is one run, or one session call, as the worker asks for it
// (sandboxapi.Request): its id, spec, tenant, output sink, artifact store
// and network.
type Request = sandboxapi.Request

// Network serves a job's way out (sandboxapi.Network); NoNetwork offers none.
type (
	Network   = sandboxapi.Network
	NoNetwork = sandboxapi.NoNetwork
)

// runHooks are what a sandbox serving a run calls back, taken from the
// run's Request at arm.
type runHooks struct {
	// Output receives the output as the program writes it (Request.Output).
	Output func(stream string, p []byte)
	// Store stores a collected artifact (Request.Store); nil: none is.
	Store func(ctx context.Context, ref job.ObjectRef, r io.Reader) error
}

func hooksOf(req Request) runHooks { return runHooks{Output: req.Output, Store: req.Store} }

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
