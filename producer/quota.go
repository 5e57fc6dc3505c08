package producer

import (
	"context"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// refuseQuota counts and returns the refusal (errQuotaExceeded) of a
// submission over quota q of its tenant's.
func (s *Server) refuseQuota(ctx context.Context, tenant string, q job.Quota, limit int64, retry time.Duration, detail string) error {
	s.tmetrics.quotaRefused(ctx, tenant, q)
	s.tmetrics.submission(ctx, tenant, "refused")
	return &refusal{kind: errQuotaExceeded, quota: q, limit: limit, retryAfter: max(retry, time.Second), detail: detail}
}

// admit applies the tenant's rate and CPU-per-day quotas to one submission.
func (s *Server) admit(ctx context.Context, tenant string) error {
	q := s.tenant(tenant).Quota
	if q.SubmissionsPerSecond <= 0 && q.CPUSecondsPerDay <= 0 {
		return nil
	}
	a, err := s.store.AdmitSubmission(ctx, tenant, cache.Rate{PerSecond: q.SubmissionsPerSecond, Burst: q.burst()},
		time.Duration(q.CPUSecondsPerDay)*time.Second, s.cfg.Now())
	if err != nil {
		return err
	}
	switch a.Quota {
	case job.QuotaRate:
		return s.refuseQuota(ctx, tenant, a.Quota, q.burst(), a.RetryAfter,
			fmt.Sprintf("more than %g submissions per second (bursts of %d): nothing was queued, retry after the Retry-After delay", q.SubmissionsPerSecond, q.burst()))
	case job.QuotaCPUDay:
		return s.refuseQuota(ctx, tenant, a.Quota, q.CPUSecondsPerDay, a.RetryAfter,
			fmt.Sprintf("your jobs used their %d CPU-seconds for today (UTC): nothing was queued; the quota renews at 00:00 UTC", q.CPUSecondsPerDay))
	}
	return nil
}

// workerQuota is what workers enforce of the tenant's settings while its
// job runs, defaults applied.
func (s *Server) workerQuota(tenant string) *job.TenantQuota {
	b := s.tenantBounds(tenant)
	t := s.tenant(tenant)
	return &job.TenantQuota{CPUSecondsPerDay: t.Quota.CPUSecondsPerDay,
		StoredBytes: b.StoredBytes, StoredObjects: b.StoredObjects, DedicatedBoxes: t.DedicatedBoxes,
		AuditRecordsPerDay: b.AuditRecordsPerDay, AuditBytesPerDay: b.AuditBytesPerDay}
}

// checkQueued applies the tenant's queued-jobs quota: the jobs waiting in
// the tenant's backlog, not yet taken for a worker's slot. Submissions
// arriving together may all pass the check, so the bound can be passed by
// the number of the tenant's submissions in flight at that moment.
func (s *Server) checkQueued(ctx context.Context, msg job.Message) error {
	tenant := msg.TenantOrDefault()
	q := s.tenant(tenant).Quota
	if q.MaxQueued <= 0 {
		return nil
	}
	jobs, err := s.queue.jobStream(ctx)
	if err != nil {
		return s.queue.queueUnavailable(ctx, msg.ID, err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	n, err := queue.Queued(cctx, jobs, job.TenantJobSubject(msg.Spec.Runtime, tenant))
	if err != nil {
		return s.queue.queueUnavailable(ctx, msg.ID, err)
	}
	if int64(n) >= q.MaxQueued {
		return s.refuseQuota(ctx, tenant, job.QuotaQueued, q.MaxQueued, s.cfg.QueueFullRetryAfter,
			fmt.Sprintf("you have %d jobs waiting in the queue, your quota is %d: nothing was queued, retry after the Retry-After delay", n, q.MaxQueued))
	}
	return nil
}

// maxCacheAge is the oldest cached result the spec accepts.
func (s *Server) maxCacheAge(spec job.Spec) time.Duration {
	if spec.Cache != nil && spec.Cache.MaxAgeS > 0 {
		return time.Duration(spec.Cache.MaxAgeS) * time.Second
	}
	return s.cfg.CacheMaxAge
}
