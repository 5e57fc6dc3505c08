package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// budgetReserve holds one run of the budget m names as the run starts: the
// API reserved it when it accepted the job, and this renews it (or takes
// it again if it lapsed while the job waited). It returns the failure to
// record instead of running when the budget cannot cover the run.
func (d *delivery) budgetReserve(ctx context.Context) (*job.Result, error) {
	w, log, m := d.w, d.log, d.m
	if m.Spec.Budget == "" {
		return nil, nil
	}
	now := w.cfg.Clock.Now()
	deadline := now.Add(m.Spec.Limits.Timeout() + w.cfg.Queue.AckWait + time.Minute)
	var r cache.BudgetReservation
	err := w.storeWatch.retry(ctx, log, func(c context.Context) error {
		var err error
		r, err = w.cfg.Store.ReserveBudget(c, tenantOf(m), m.Spec.Budget, m.ID, m.Spec.Limits, deadline, now)
		return err
	})
	var msg string
	switch {
	case errors.Is(err, cache.ErrNotFound):
		msg = fmt.Sprintf("%s: budget %s expired before the job could run; the job did not start", job.ProblemBudgetExhausted, m.Spec.Budget)
	case err != nil:
		return nil, fmt.Errorf("reserve budget: %w", err)
	case r.OK:
		return nil, nil
	default:
		b := r.Budget
		msg = fmt.Sprintf("%s: budget %s cannot cover the run (runs %d of %d used, %d held; cpu_ms %d of %d used, %d held; wall_ms %d of %d used, %d held; artifact bytes %d of %d); the job did not start and retrying will not help",
			job.ProblemBudgetExhausted, b.ID, b.Used.Runs, b.MaxRuns, b.Reserved.Runs, b.Used.CPUMS, b.MaxCPUMS, b.Reserved.CPUMS,
			b.Used.WallMS, b.MaxWallMS, b.Reserved.WallMS, b.Used.ArtifactBytes, b.MaxArtifactBytes)
	}
	log.InfoContext(ctx, "run refused by its budget", slog.String("budget", m.Spec.Budget))
	return &job.Result{ID: m.ID, Status: job.StatusFailed, Error: job.NewFailure(job.CategoryQuota, msg)}, nil
}

// settleBudget ends the run's reservation and charges what it used to the
// budget, once the result is recorded: a run (unless it never started),
// its CPU and wall time and its artifacts' bytes. A result that lost to
// another one charges nothing.
func (rc *recorder) settleBudget(ctx context.Context, log *slog.Logger, m job.Message, r job.Result, won bool) {
	if m.Spec.Budget == "" {
		return
	}
	ran := won && (r.Error == nil || r.Error.Category != job.CategoryQuota)
	var use job.BudgetUse
	if ran {
		use = job.BudgetUse{Runs: 1, CPUMS: r.CPUMS, WallMS: r.WallMS}
		for _, a := range r.Artifacts {
			use.ArtifactBytes += a.Size
		}
	}
	if _, err := rc.store.SettleBudget(ctx, tenantOf(m), m.Spec.Budget, m.ID, ran, use); err != nil {
		log.WarnContext(ctx, "settle budget; its reservation lapses by itself", slog.String("budget", m.Spec.Budget), slog.Any("error", err))
	}
}
