package containerd

import (
	"context"
	"log/slog"

	"github.com/containerd/containerd"
)

// Backend is what the sandbox facade asks of containerd beyond one
// sandbox's container and task: the images' shared root views, waits on a
// task's exit that survive an outage, and the removal of what a worker
// left (its own orphans, a redelivered job's sandboxes, sandboxes past
// their deadline).
type Backend struct {
	Client      *containerd.Client
	Snapshotter string
	// LeaseScope is the store whose leases say whether a sandbox's worker
	// is gone (LabelLeaseScope).
	LeaseScope string
	Log        *slog.Logger
	// Life ends when the runtime closes: waits made again on a task across
	// an outage end with it.
	Life context.Context
	// Owns reports whether the runtime holds container id (idle in its
	// pool, running a job, being removed): the reaping of orphans and the
	// sweep leave it.
	Owns func(id string) bool
}
