package worker

import (
	"context"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Runtime is the part of sandbox.Runtime the worker uses.
type Runtime interface {
	Run(ctx context.Context, id string, spec job.Spec) (job.Result, error)
	Image(ctx context.Context, runtime string) (job.Image, error)
	Runtimes() []string
}

// RuntimeDescriber is implemented by runtimes that know a runtime's
// contract (sandbox.Containerd reads it from the image's profile and package
// list); the worker advertises it for GET /v1/runtimes and the API's checks.
type RuntimeDescriber interface {
	RuntimeInfo(ctx context.Context, runtime string) (job.RuntimeInfo, error)
}

// createFailure is implemented by Runtime errors meaning the sandbox could not
// be created or started (sandbox.ErrCreate's chain), counted apart from
// failures later in a run.
type createFailure interface {
	SandboxCreateFailed() bool
}

// HealthChecker is implemented by runtimes that can tell whether their
// backend answers (sandbox.Containerd: containerd's health service). The
// worker pulls no job while it does not (backend.go).
type HealthChecker interface {
	Healthy(ctx context.Context) error
}

// Reaper is implemented by runtimes that can remove containers a crashed
// worker with the same id left behind.
type Reaper interface {
	ReapOrphans(ctx context.Context, workerID string) (int, error)
}

// Starter is implemented by runtimes with background work of their own (the
// sandbox runtime's warm pool): Run starts it once the worker holds its id
// and has reaped a predecessor's containers. The runtime's Close stops it.
type Starter interface {
	Start(ctx context.Context) error
}

// Store is the part of cache.Store the worker uses.
type Store interface {
	MarkRunningLeased(ctx context.Context, id, worker string, attempt int, at time.Time, lease cache.Lease) (job.Status, error)
	RenewLease(ctx context.Context, id string, lease cache.Lease) (bool, error)
	ReleaseLease(ctx context.Context, id, token string) (bool, error)
	Finish(ctx context.Context, id string, res job.Result) (bool, error)
	Abandon(ctx context.Context, id string, res job.Result) (bool, error)
	// ConfirmTerminal returns the job's status, and for a terminal one first
	// makes sure the replicas the store requires hold it (durable.go).
	ConfirmTerminal(ctx context.Context, id string) (job.Status, error)
	StoreResult(ctx context.Context, key string, res job.Result) error
	// ReserveCPU and SettleCPU bracket a run in its tenant's CPU quota (cpuquota.go).
	ReserveCPU(ctx context.Context, tenant, id string, cpu, limit, ttl time.Duration, now time.Time) (cache.CPUReservation, error)
	SettleCPU(ctx context.Context, tenant, id string, cpu time.Duration, at time.Time) error
	// GetJob reads a job's record: a replay's original (replay.go).
	GetJob(ctx context.Context, id string) (cache.Record, error)
	// ReserveBudget and SettleBudget bracket a run in the budget its job names (budget.go).
	ReserveBudget(ctx context.Context, tenant, id, jobID string, l job.Limits, deadline, now time.Time) (cache.BudgetReservation, error)
	SettleBudget(ctx context.Context, tenant, id, jobID string, ran bool, use job.BudgetUse) (bool, error)
	// ReserveStored and ReleaseStored count what a tenant's jobs keep in the object store (storequota.go).
	ReserveStored(ctx context.Context, tenant string, size, maxBytes, maxObjects int64, window time.Duration, now time.Time) (cache.StoredUsage, bool, error)
	ReleaseStored(ctx context.Context, tenant string, size int64, at time.Time) error
	RegisterRuntime(ctx context.Context, info job.RuntimeInfo, ttl time.Duration) error
	// Ping probes the store; a success lifts the pause on pulls.
	Ping(ctx context.Context) error
	// CreateJob recreates a record the store lost, from the job's message.
	CreateJob(ctx context.Context, msg job.Message) error
	// The worker id's lease (ownership.go).
	AcquireWorker(ctx context.Context, id, instance string, ttl time.Duration) error
	RenewWorker(ctx context.Context, id, instance string, ttl time.Duration) (bool, error)
	ReleaseWorker(ctx context.Context, id, instance string) error
	WorkerAlive(ctx context.Context, id string) (bool, error)
}
