package producer

import (
	"context"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Store is the part of the Redis layer the API uses. *cache.Store satisfies
// it; errors follow cache's conventions (cache.ErrNotFound, cache.ErrExists,
// cache.ErrUnavailable, checked with errors.Is).
type Store interface {
	BudgetStore
	Ping(ctx context.Context) error
	CreateUnpublishedJob(ctx context.Context, msg job.Message) error
	GetJob(ctx context.Context, id string) (cache.Record, error)
	GetJobs(ctx context.Context, ids []string) ([]*cache.Record, error)
	DeleteJob(ctx context.Context, id string) error
	Finish(ctx context.Context, id string, res job.Result) (won bool, err error)
	CancelReport(ctx context.Context, id string) (st job.Status, canceledNow bool, err error)
	LookupResult(ctx context.Context, key string) (job.Result, bool, error)
	ClaimInflight(ctx context.Context, key, id string) (leaderID string, claimed bool, err error)
	ReleaseInflight(ctx context.Context, key, id string) error
	ClaimIdempotency(ctx context.Context, scope, key, bodyHash, jobID string) (existingJobID, existingHash string, claimed bool, err error)
	Runtimes(ctx context.Context) ([]job.RuntimeInfo, error)
	AdmitSubmission(ctx context.Context, tenant string, rate cache.Rate, cpuLimit time.Duration, now time.Time) (cache.Admission, error)
	// ReserveAudit counts what a tenant appends to its audit log per day (audit.go).
	ReserveAudit(ctx context.Context, tenant string, records, bytes, maxRecords, maxBytes int64, now time.Time) (cache.AuditAdmission, error)
	// Publish-state tracking (cache/publish.go) and cache-hit records (cache/alias.go).
	MarkPublished(ctx context.Context, id string) error
	Unpublished(ctx context.Context, olderThan time.Time, limit int) ([]string, error)
	ForgetUnpublished(ctx context.Context, id string) error
	CreateAlias(ctx context.Context, msg job.Message, res job.Result) error
	// The cache-hit path's one round trip (cache/known.go).
	KnownResult(key string) (*cache.KnownResult, bool)
	CreateAliasOfKnown(ctx context.Context, known *cache.KnownResult, msg job.Message) (bool, error)
	CreateHitOfKnown(ctx context.Context, known *cache.KnownResult, msg job.Message) (bool, error)
}

var _ Store = (*cache.Store)(nil)
