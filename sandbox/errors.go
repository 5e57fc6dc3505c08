package sandbox

import (
	"errors"
)

// errNoWorker is returned by ReapOrphans without a worker id.
var errNoWorker = errors.New("sandbox: ReapOrphans needs a worker id")

// ErrCreate is in the chain of Run's error when the sandbox could not be
// created or started (containerd or runc refused), as opposed to a failure
// later on. The error also has a SandboxCreateFailed() bool method, for
// callers that match on behaviour rather than import this package.
var ErrCreate = errors.New("sandbox could not be created")

type createError struct{ err error }

func (e createError) Error() string             { return ErrCreate.Error() + ": " + e.err.Error() }
func (e createError) Unwrap() []error           { return []error{ErrCreate, e.err} }
func (e createError) SandboxCreateFailed() bool { return true }
