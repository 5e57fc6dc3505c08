package sandbox

import (
	"context"

	"github.com/kilnrun/kiln/job"
)

// Runtime runs jobs in sandboxes.
type Runtime interface {
	// Run runs one validated job whose limits are already resolved. A bad
	// spec gives an error wrapping *job.InvalidError and runs nothing.
	// Platform faults give a Result with status internal_error (category
	// internal, retryable) and a non-nil error. Cancelling ctx kills the job:
	// status canceled (category canceled) and a nil error, since the job
	// itself ran as asked.
	Run(ctx context.Context, id string, spec job.Spec) (job.Result, error)
	// Image returns the name and manifest digest of a runtime's image, as
	// containerd has it now.
	Image(ctx context.Context, runtime string) (job.Image, error)
	// Runtimes lists the runtime names this Runtime can run, sorted.
	Runtimes() []string
	// Close releases the connection. Jobs still running are not waited for.
	Close() error
}
