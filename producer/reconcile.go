package producer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Reconcile republishes, every ReconcileInterval until ctx ends, queued jobs
// older than ReconcileAfter whose publish was never confirmed: the API that
// recorded them died before publishing, or its publish timed out and the
// client did not retry. A republish within JetStream's duplicate window is
// dropped as a duplicate if the first publish was stored after all; a later
// one is a second message, which the worker acks at once once the job is
// terminal (and holds, by the job's lease, while it runs). Every API
// process may run it: two republishing the same job are deduplicated too.
func (s *Server) Reconcile(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := s.ReconcileOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "reconcile unpublished jobs", slog.Any("error", err))
		} else if n > 0 {
			s.log.InfoContext(ctx, "republished jobs whose publish was never confirmed", slog.Int("count", n))
		}
	}
}

// ReconcileOnce is one pass of Reconcile; it returns how many jobs it
// republished.
func (s *Server) ReconcileOnce(ctx context.Context) (int, error) {
	ids, err := s.store.Unpublished(ctx, s.cfg.Now().Add(-s.cfg.ReconcileAfter), 100)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		rec, err := s.store.GetJob(ctx, id)
		switch {
		case errors.Is(err, cache.ErrNotFound):
			// Rolled back, expired, or the producer died before recording it.
			s.queue.forgetUnpublished(ctx, id)
			continue
		case err != nil:
			return n, err
		case rec.Status != job.StatusQueued:
			// A worker got it: the first publish was stored after all.
			if err := s.store.MarkPublished(ctx, id); err != nil {
				return n, err
			}
			continue
		}
		if err := s.queue.ensurePublished(ctx, &rec); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
