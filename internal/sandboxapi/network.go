package sandboxapi

import (
	"context"
	"net"

	"github.com/kilnrun/kiln/job"
)

// Network is what a job's network namespace gets: the backend makes a
// listener on the job's proxy address inside the job's own namespace and
// hands it to Serve. worker/egress's allowlisting proxy is the worker's
// (worker/egress.go).
type Network interface {
	// Enabled reports whether this Network gives a job a way out at all.
	// False: a job whose spec asks for a network is refused as an invalid
	// request, before anything of it is made.
	Enabled() bool
	// Serve serves ln until ctx ends, then returns once every connection
	// has ended, with the job's account of them. The backend closes ln
	// once Serve has returned.
	Serve(ctx context.Context, ln net.Listener) *job.Egress
}

// NoNetwork is the Network of a worker that offers none: jobs asking for a
// network are refused.
type NoNetwork struct{}

// Enabled is false.
func (NoNetwork) Enabled() bool { return false }

// Serve accounts for nothing at once; a backend never calls it, since
// Enabled is false.
func (NoNetwork) Serve(context.Context, net.Listener) *job.Egress { return &job.Egress{} }
