package worker

import (
	"context"
	"log/slog"

	"github.com/kilnrun/kiln/job"
)

// compareReplay notes on r, a replay's result, the job it replays and how
// its outcome compares with that job's result. A missing original (its
// record expired meanwhile) leaves the comparison out; the link stays.
func (d *delivery) compareReplay(ctx context.Context, r *job.Result) {
	w, log, m := d.w, d.log, d.m
	if m.ReplayOf == "" {
		return
	}
	r.ReplayOf = m.ReplayOf
	orig, err := w.cfg.Store.GetJob(ctx, m.ReplayOf)
	if err != nil || orig.Result == nil || orig.Message.TenantOrDefault() != m.TenantOrDefault() {
		log.WarnContext(ctx, "read the replayed job's result; the replay is recorded without a comparison",
			slog.String("replay_of", m.ReplayOf), slog.Any("error", err))
		return
	}
	c := job.CompareReplay(orig.Result, r)
	r.Replay = &c
}
