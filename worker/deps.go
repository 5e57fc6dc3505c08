package worker

import (
	"context"
	"errors"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// Sandboxes is the sandbox backend, the one interface the worker calls it
// through (package sandbox's Containerd implements it; the fakes of tests
// embed testkit.NoSandbox). A backend without an optional part says so
// here: RuntimeInfo, Healthy, ReapOrphans, ReapJob and ReapExpired return
// an error wrapping errors.ErrUnsupported, Start has nothing to start,
// HostsSessions is false.
type Sandboxes interface {
	// Run runs one job as req asks (sandboxapi.Request: its id, spec,
	// tenant, output sink, artifact store and network). A bad spec gives an
	// error wrapping *job.InvalidError and runs nothing; a platform fault
	// gives status internal_error and an error; cancelling ctx kills the
	// job (status canceled, nil error).
	Run(ctx context.Context, req sandboxapi.Request) (job.Result, error)
	// Image returns the name and digest of a runtime's image as the
	// backend has it now.
	Image(ctx context.Context, runtime string) (job.Image, error)
	// Runtimes lists the runtime names the backend runs, sorted.
	Runtimes() []string
	// RuntimeInfo is a runtime's contract (main file, reserved names,
	// packages), advertised for GET /v1/runtimes and the API's checks.
	// Unsupported: the worker advertises the image alone.
	RuntimeInfo(ctx context.Context, runtime string) (job.RuntimeInfo, error)
	// Healthy tells whether the backend answers; the worker pulls no job
	// while it does not (backend.go). Unsupported: the worker has no
	// backend to watch and neither probes nor reports it.
	Healthy(ctx context.Context) error
	// Start starts the backend's own background work (the warm pool) once
	// the worker holds its id and has reaped a predecessor's sandboxes.
	Start(ctx context.Context) error
	// ReapOrphans removes the sandboxes a crashed worker with the same id
	// left behind and says how many.
	ReapOrphans(ctx context.Context, workerID string) (int, error)
	// ReapJob removes one job's sandboxes on this host, keeping those of
	// the workers keep approves (ownership.go).
	ReapJob(ctx context.Context, jobID string, keep func(workerID string) bool) ([]string, error)
	// ReapExpired removes this host's sandboxes that outlived their
	// wall-clock limit, and those whose worker keep does not approve.
	ReapExpired(ctx context.Context, keep func(workerID string) bool) ([]string, error)
	// HostsSessions reports whether the backend hosts sessions: without
	// it the worker takes no session request.
	HostsSessions() bool
	// OpenSession makes a session's box (session.go).
	OpenSession(ctx context.Context, o sandboxapi.SessionOptions) (sandboxapi.Session, error)
}

// unsupported reports whether err is a backend's "cannot do that".
func unsupported(err error) bool { return errors.Is(err, errors.ErrUnsupported) }

// createFailure is implemented by Sandboxes errors meaning the sandbox
// could not be created or started (sandbox.ErrCreate's chain), counted apart
// from failures later in a run.
type createFailure interface {
	SandboxCreateFailed() bool
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
	// ReserveAudit counts what a tenant appends to its audit log per day (audit.go).
	ReserveAudit(ctx context.Context, tenant string, records, bytes, maxRecords, maxBytes int64, now time.Time) (cache.AuditAdmission, error)
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
