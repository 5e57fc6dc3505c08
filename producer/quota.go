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
func (t *tenants) refuseQuota(ctx context.Context, tenant string, q job.Quota, limit int64, retry time.Duration, detail string) error {
	t.tmetrics.quotaRefused(ctx, tenant, q)
	t.tmetrics.submission(ctx, tenant, "refused")
	return &refusal{kind: errQuotaExceeded, quota: q, limit: limit, retryAfter: max(retry, time.Second), detail: detail}
}

// admit applies the tenant's rate and CPU-per-day quotas to one submission.
func (t *tenants) admit(ctx context.Context, tenant string) error {
	q := t.tenant(tenant).Quota
	if q.SubmissionsPerSecond <= 0 && q.CPUSecondsPerDay <= 0 {
		return nil
	}
	a, err := t.store.AdmitSubmission(ctx, tenant, cache.Rate{PerSecond: q.SubmissionsPerSecond, Burst: q.burst()},
		time.Duration(q.CPUSecondsPerDay)*time.Second, t.cfg.Now())
	if err != nil {
		return err
	}
	switch a.Quota {
	case job.QuotaRate:
		return t.refuseQuota(ctx, tenant, a.Quota, q.burst(), a.RetryAfter,
			fmt.Sprintf("more than %g submissions per second (bursts of %d): nothing was queued, retry after the Retry-After delay", q.SubmissionsPerSecond, q.burst()))
	case job.QuotaCPUDay:
		return t.refuseQuota(ctx, tenant, a.Quota, q.CPUSecondsPerDay, a.RetryAfter,
			fmt.Sprintf("your jobs used their %d CPU-seconds for today (UTC): nothing was queued; the quota renews at 00:00 UTC", q.CPUSecondsPerDay))
	}
	return nil
}

// workerQuota is what workers enforce of the tenant's settings while its
// job runs, defaults applied.
func (t *tenants) workerQuota(tenant string) *job.TenantQuota {
	b := t.tenantBounds(tenant)
	ts := t.tenant(tenant)
	return &job.TenantQuota{CPUSecondsPerDay: ts.Quota.CPUSecondsPerDay,
		StoredBytes: b.StoredBytes, StoredObjects: b.StoredObjects, DedicatedBoxes: ts.DedicatedBoxes,
		AuditRecordsPerDay: b.AuditRecordsPerDay, AuditBytesPerDay: b.AuditBytesPerDay}
}

// checkQueued applies the tenant's queued-jobs quota: the jobs waiting in
// the tenant's backlog, not yet taken for a worker's slot. Submissions
// arriving together may all pass the check, so the bound can be passed by
// the number of the tenant's submissions in flight at that moment.
func (t *tenants) checkQueued(ctx context.Context, msg job.Message) error {
	tenant := msg.TenantOrDefault()
	q := t.tenant(tenant).Quota
	if q.MaxQueued <= 0 {
		return nil
	}
	jobs, err := t.queue.jobStream(ctx)
	if err != nil {
		return t.queue.queueUnavailable(ctx, msg.ID, err)
	}
	cctx, cancel := context.WithTimeout(ctx, t.cfg.PublishTimeout)
	defer cancel()
	n, err := queue.Queued(cctx, jobs, job.TenantJobSubject(msg.Spec.Runtime, tenant))
	if err != nil {
		return t.queue.queueUnavailable(ctx, msg.ID, err)
	}
	if int64(n) >= q.MaxQueued {
		return t.refuseQuota(ctx, tenant, job.QuotaQueued, q.MaxQueued, t.cfg.QueueFullRetryAfter,
			fmt.Sprintf("you have %d jobs waiting in the queue, your quota is %d: nothing was queued, retry after the Retry-After delay", n, q.MaxQueued))
	}
	return nil
}

// maxCacheAge is the oldest cached result the spec accepts; def when it
// names none (Config.CacheMaxAge).
func maxCacheAge(spec job.Spec, def time.Duration) time.Duration {
	if spec.Cache != nil && spec.Cache.MaxAgeS > 0 {
		return time.Duration(spec.Cache.MaxAgeS) * time.Second
	}
	return def
}
