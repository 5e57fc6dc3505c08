package runhooks

import (
	"context"
	"io"
	"net"

	"github.com/kilnrun/kiln/job"
)

// Hooks are the callbacks of one run. The zero Hooks does nothing.
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
	// Tenant is the job's tenant: a box serves one tenant's jobs only.
	Tenant string
	// Egress serves a job's way out when its spec has a network: ln
	// listens on the job's proxy address inside the job's own network
	// namespace; Egress serves it until ctx ends, then returns once every
	// connection has ended, with the job's account of them. Nil: a job
	// with a network is refused (this worker offers none).
	Egress func(ctx context.Context, ln net.Listener) *job.Egress
}

type key struct{}

// With returns ctx carrying h for the run it is passed to.
func With(ctx context.Context, h Hooks) context.Context {
	return context.WithValue(ctx, key{}, h)
}

// From returns the hooks ctx carries, or the zero Hooks.
func From(ctx context.Context) Hooks {
	h, _ := ctx.Value(key{}).(Hooks)
	return h
}
