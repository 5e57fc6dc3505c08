package sandboxapi

import (
	"context"
	"io"

	"github.com/kilnrun/kiln/job"
)

// Request is one run of a job, or one call of a session, as the worker asks
// for it. The zero value of each callback does nothing.
type Request struct {
	// ID names the run (the job's id, or the call's).
	ID string
	// Spec is the validated job; its limits are already resolved.
	Spec job.Spec
	// Tenant owns the run. A session's calls run in the box of the
	// session's tenant, whatever this says.
	Tenant string
	// DedicatedBoxes keeps the run to boxes that serve Tenant alone (the
	// tenant's dedicated_boxes setting); otherwise a box serves any
	// tenant, one job at a time, each in a fresh inner sandbox.
	DedicatedBoxes bool
	// Output is called with each chunk of stdout ("stdout") or stderr
	// ("stderr") as the program writes it, including bytes beyond the
	// output cap. It runs on the output copy path: it must not block.
	Output func(stream string, p []byte)
	// Store stores one collected artifact, content-addressed: ref names the
	// content's SHA-256 and size (its Tenant is left empty: the store knows
	// whose run it is), r yields exactly ref.Size bytes. Nil: the output dir
	// is not collected and Result.Artifacts stays empty.
	Store func(ctx context.Context, ref job.ObjectRef, r io.Reader) error
	// Network serves the job's way out when its spec has a network. Nil
	// means NoNetwork.
	Network Network
}

// Net is r's Network, NoNetwork when it has none.
func (r Request) Net() Network {
	if r.Network == nil {
		return NoNetwork{}
	}
	return r.Network
}
