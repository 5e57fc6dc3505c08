package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// reservedCPU is what a run may use of the quota: its CPU limit, rounded
// up to whole seconds as RLIMIT_CPU enforces it.
func reservedCPU(l job.Limits) time.Duration {
	return time.Duration((l.CPUMS+999)/1000) * time.Second
}

// cpuReserve reserves the run's CPU of its tenant's quota; it returns the
// failure to record instead of running when the quota cannot cover it.
func (d *delivery) cpuReserve(ctx context.Context) (*job.Result, error) {
	w, log, m := d.w, d.log, d.m
	if m.Quota == nil || m.Quota.CPUSecondsPerDay <= 0 {
		return nil, nil
	}
	tenant := tenantOf(m)
	quota := time.Duration(m.Quota.CPUSecondsPerDay) * time.Second
	want := reservedCPU(m.Spec.Limits)
	// A reservation outlives its run only when the worker died: the job's
	// redelivery replaces it, and it lapses by itself after that.
	ttl := m.Spec.Limits.Timeout() + w.cfg.Queue.AckWait + time.Minute
	var r cache.CPUReservation
	err := w.storeWatch.retry(ctx, log, func(c context.Context) error {
		var err error
		r, err = w.cfg.Store.ReserveCPU(c, tenant, m.ID, want, quota, ttl, w.cfg.Clock.Now())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reserve cpu time: %w", err)
	}
	if r.OK {
		return nil, nil
	}
	left := max(quota-r.Used-r.Reserved, 0)
	msg := fmt.Sprintf("%s: the run needs its CPU limit of %v (limits.cpu_ms %d, rounded up to whole seconds) but %v of the tenant's %d CPU-seconds for today (UTC) are left (%v used, %v reserved by its runs in flight); the job did not start: lower limits.cpu_ms, or submit again after 00:00 UTC (in %v)",
		job.QuotaCPUDay, want, m.Spec.Limits.CPUMS, left, m.Quota.CPUSecondsPerDay, r.Used, r.Reserved, r.RetryAfter.Round(time.Minute))
	log.InfoContext(ctx, "run refused by the tenant's cpu quota", slog.Duration("want", want), slog.Duration("used", r.Used), slog.Duration("reserved", r.Reserved))
	return &job.Result{ID: m.ID, Status: job.StatusFailed, Error: job.NewFailure(job.CategoryQuota, msg)}, nil
}

// settleCPU drops the run's reservation and charges the CPU it used to its
// tenant (the CPU-seconds-per-day quota counts every job that ran), once
// the result is recorded; a result that lost to another one charges nothing.
func (rc *recorder) settleCPU(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, won bool) {
	used := time.Duration(0)
	if won {
		used = time.Duration(r.CPUMS) * time.Millisecond
	}
	if err := rc.store.SettleCPU(ctx, tenantOf(m), m.ID, used, rc.clock.Now()); err != nil {
		log.WarnContext(ctx, "settle cpu time of tenant", slog.Any("error", err))
	}
}
