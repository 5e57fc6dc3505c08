package sandbox

import (
	"context"

	"github.com/kilnrun/kiln/job"
)

// Runtime runs jobs in sandboxes.
type Runtime interface {
	// Run runs one validated job (req.Spec, its limits already resolved)
	// for req.Tenant, its output to req.Output, its artifacts to req.Store,
	// its network (if it asks for one) served by req.Network. A bad spec
	// gives an error wrapping *job.InvalidError and runs nothing, as does a
	// network the request (or the isolation) cannot give. Platform faults
	// give a Result with status internal_error (category internal,
	// retryable) and a non-nil error. Cancelling ctx kills the job: status
	// canceled (category canceled) and a nil error, since the job itself
	// ran as asked.
	Run(ctx context.Context, req Request) (job.Result, error)
	// Image returns the name and manifest digest of a runtime's image, as
	// containerd has it now.
	Image(ctx context.Context, runtime string) (job.Image, error)
	// Runtimes lists the runtime names this Runtime can run, sorted.
	Runtimes() []string
	// Close releases the connection. Jobs still running are not waited for.
	Close() error
}
