package producer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// refuseQuota counts and returns the refusal (errQuotaExceeded) of a
// submission over quota q of its tenant's.
func (s *Server) refuseQuota(ctx context.Context, tenant string, q job.Quota, limit int64, retry time.Duration, detail string) error {
	s.tmetrics.QuotaRefused(ctx, s.metricTenant(tenant), string(q))
	s.tmetrics.Submission(ctx, s.metricTenant(tenant), "refused")
	return &refusal{kind: errQuotaExceeded, quota: q, limit: limit, retryAfter: max(retry, time.Second), detail: detail}
}

// admit applies the tenant's rate and CPU-per-day quotas to one submission.
func (s *Server) admit(ctx context.Context, tenant string) error {
	q := s.tenant(tenant).Quota
	if q.SubmissionsPerSecond <= 0 && q.CPUSecondsPerDay <= 0 {
		return nil
	}
	a, err := s.store.AdmitSubmission(ctx, tenant, cache.Rate{PerSecond: q.SubmissionsPerSecond, Burst: q.burst()},
		time.Duration(q.CPUSecondsPerDay)*time.Second, time.Now())
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
	return &job.TenantQuota{CPUSecondsPerDay: s.tenant(tenant).Quota.CPUSecondsPerDay,
		StoredBytes: b.StoredBytes, StoredObjects: b.StoredObjects}
}

// checkQueued applies the tenant's queued-jobs quota: the jobs of the
// tenant's consumer not yet delivered to a worker. Submissions arriving
// together may all pass the check, so the bound can be passed by the number
// of the tenant's submissions in flight at that moment.
func (s *Server) checkQueued(ctx context.Context, msg job.Message) error {
	tenant := msg.TenantOrDefault()
	q := s.tenant(tenant).Quota
	if q.MaxQueued <= 0 {
		return nil
	}
	cons, err := s.tenantConsumer(ctx, msg)
	if err != nil {
		return s.queueUnavailable(ctx, msg.ID, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		s.consumers.Delete(msg.Spec.Runtime + "\x00" + tenant) // bind again next time
		return s.queueUnavailable(ctx, msg.ID, fmt.Errorf("read consumer of tenant %s: %w", tenant, err))
	}
	if int64(info.NumPending) >= q.MaxQueued {
		return s.refuseQuota(ctx, tenant, job.QuotaQueued, q.MaxQueued, s.cfg.QueueFullRetryAfter,
			fmt.Sprintf("you have %d jobs waiting in the queue, your quota is %d: nothing was queued, retry after the Retry-After delay", info.NumPending, q.MaxQueued))
	}
	return nil
}

// ensureTenantConsumer creates or updates the tenant's consumer for the
// job's runtime once per process, before the tenant's first publish, so
// the tenant's running-jobs bound is in force before workers see its jobs.
func (s *Server) ensureTenantConsumer(ctx context.Context, msg job.Message) error {
	_, err := s.tenantConsumer(ctx, msg)
	return err
}

func (s *Server) tenantConsumer(ctx context.Context, msg job.Message) (jetstream.Consumer, error) {
	tenant := msg.TenantOrDefault()
	k := msg.Spec.Runtime + "\x00" + tenant
	if c, ok := s.consumers.Load(k); ok {
		return c.(jetstream.Consumer), nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	c, err := queue.EnsureTenantConsumer(cctx, s.js, s.cfg.Queue, msg.Spec.Runtime, tenant, int(s.tenant(tenant).Quota.MaxRunning))
	if err != nil {
		s.log.WarnContext(ctx, "ensure tenant consumer", slog.String("runtime", msg.Spec.Runtime), slog.Any("error", err))
		return nil, err
	}
	s.consumers.Store(k, c)
	return c, nil
}

// maxCacheAge is the oldest cached result the spec accepts.
func (s *Server) maxCacheAge(spec job.Spec) time.Duration {
	if spec.Cache != nil && spec.Cache.MaxAgeS > 0 {
		return time.Duration(spec.Cache.MaxAgeS) * time.Second
	}
	return s.cfg.CacheMaxAge
}
