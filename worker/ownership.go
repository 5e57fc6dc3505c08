package worker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// A worker id names one live process. The worker holds its id by a lease in
// the store (cache.AcquireWorker), renewed every IDLease/3:
//
//   - A second process started with a live id refuses to start (Run returns
//     an error wrapping cache.ErrWorkerIDInUse) after waiting up to IDLease
//     for the lease to lapse, which is what a restart after a crash needs.
//     Refusing rather than taking a distinct id keeps the id stable, which
//     is what results, logs and start-up reaping rely on.
//   - Start-up reaping (Sandboxes.ReapOrphans) runs only once the lease is ours, so it
//     never removes the sandboxes of a live worker that shares the id.
//   - When a job is redelivered, the worker that takes it removes the job's
//     sandboxes on its host whose worker's lease has lapsed, before running
//     it, and asks every other worker (ReapSubject) to do the same on theirs.

// instanceToken names this process among the processes that may claim the
// same worker id.
func instanceToken() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), rand.Text()[:8])
}

// ownership is this process's hold on its worker id, and the reaping of
// sandboxes whose worker is gone: a redelivered job's (reapJob, onReap) and,
// every SweepInterval, any past its limit or of a lapsed worker (sweep).
type ownership struct {
	id       string        // the worker id
	instance string        // this process's token on the worker id's lease
	lease    time.Duration // IDLease
	sweepAt  time.Duration // SweepInterval
	store    Store
	sw       *storeWatch
	rt       Sandboxes
	clock    Clock
	log      *slog.Logger
	metrics  *ktrace.Metrics
	tasks    *tasks // the reaps other workers ask for, which Run waits for
	// runsHere reports whether a job runs on this worker now: its sandbox
	// is not a predecessor's.
	runsHere func(id string) bool
}

func newOwnership(cfg *Config, log *slog.Logger, sw *storeWatch, t *tasks, runsHere func(string) bool) *ownership {
	return &ownership{id: cfg.ID, instance: instanceToken(), lease: cfg.IDLease, sweepAt: cfg.SweepInterval,
		store: cfg.Store, sw: sw, rt: cfg.Runtime, clock: cfg.Clock, log: log, metrics: cfg.Metrics, tasks: t, runsHere: runsHere}
}

// acquire takes the worker id's lease, waiting up to IDLease (plus a
// second) for a lease left by a dead process to lapse, and retrying while
// the store is unreachable until ctx ends.
func (o *ownership) acquire(ctx context.Context) error {
	clock := o.clock
	deadline := clock.Now().Add(o.lease + time.Second)
	logged := false
	for {
		err := o.sw.retry(ctx, o.log, func(c context.Context) error {
			return o.store.AcquireWorker(c, o.id, o.instance, o.lease)
		})
		if err == nil {
			return nil
		}
		if !errors.Is(err, cache.ErrWorkerIDInUse) {
			return fmt.Errorf("worker: take worker id %q: %w", o.id, err)
		}
		if clock.Now().After(deadline) {
			return fmt.Errorf("worker: worker id %q is held by another live worker (%w); give every worker process a distinct --id (KILN_WORKER_ID)", o.id, err)
		}
		if !logged {
			logged = true
			o.log.WarnContext(ctx, "worker id is held by another process; waiting for its lease to lapse (a crashed predecessor) before giving up",
				slog.Duration("up_to", o.lease+time.Second), slog.Any("reason", err))
		}
		if !sleepOn(ctx, clock, 200*time.Millisecond) {
			return fmt.Errorf("worker: take worker id %q: %w", o.id, context.Cause(ctx))
		}
	}
}

// hold renews the worker id's lease until ctx ends, then releases it.
func (o *ownership) hold(ctx context.Context) {
	t := time.NewTicker(o.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := o.store.ReleaseWorker(rctx, o.id, o.instance); err != nil {
				o.log.Warn("release worker id", slog.Any("error", err))
			}
			cancel()
			return
		case <-t.C:
		}
		held, err := o.store.RenewWorker(ctx, o.id, o.instance, o.lease)
		switch {
		case err != nil && ctx.Err() == nil:
			o.log.WarnContext(ctx, "renew worker id lease", slog.Any("error", err))
		case err == nil && !held:
			o.log.ErrorContext(ctx, "ANOTHER PROCESS TOOK THIS WORKER'S ID while its lease had lapsed (the store was unreachable); give every worker a distinct --id")
		}
	}
}

// reapJob removes this host's sandboxes of a redelivered job whose worker
// is gone. A sandbox of a worker whose lease is still live is kept, after
// waiting up to IDLease for it to lapse: the queue redelivers the job when
// its worker's heartbeats stop, and the worker's lease lapses about as
// fast, so a worker still holding its lease then is alive but cut off from
// the store, and its sandbox is its own to end.
func (o *ownership) reapJob(ctx context.Context, log *slog.Logger, id string) {
	clock := o.clock
	deadline := clock.Now().Add(o.lease)
	keep := func(owner string) bool {
		if owner == o.id {
			return o.runsHere(id) // ours and live; anything else of ours is a predecessor's
		}
		for {
			alive, err := o.store.WorkerAlive(ctx, owner)
			if err != nil {
				log.WarnContext(ctx, "check whether a sandbox's worker is alive; keeping the sandbox", slog.String("owner", owner), slog.Any("error", err))
				return true
			}
			if !alive {
				return false
			}
			if clock.Now().After(deadline) || !sleepOn(ctx, clock, 200*time.Millisecond) {
				log.WarnContext(ctx, "a sandbox of this job belongs to a worker that is still alive; leaving it", slog.String("owner", owner))
				return true
			}
		}
	}
	reaped, err := o.rt.ReapJob(ctx, id, keep)
	if unsupported(err) {
		return
	}
	if err != nil {
		log.WarnContext(ctx, "reap sandboxes of a redelivered job", slog.Any("error", err))
	}
	o.metrics.OrphanReaped(ctx, len(reaped))
}

// announceRedelivery asks every worker to reap the job's orphaned sandboxes
// on its host (onReap), reaps this host's first, and returns once they are gone.
func (d *delivery) announceRedelivery(ctx context.Context) {
	w, log, id := d.w, d.log, d.m.ID
	if err := w.cfg.NATS.Publish(job.ReapSubject, []byte(id)); err != nil {
		log.WarnContext(ctx, "ask other hosts to reap the job's orphaned sandboxes", slog.Any("error", err))
	}
	w.owner.reapJob(ctx, log, id)
}

// onReap handles another worker's redelivery announcement.
func (o *ownership) onReap(ctx context.Context) nats.MsgHandler {
	return func(m *nats.Msg) {
		id := string(m.Data)
		if !job.ValidID(id) {
			return
		}
		o.tasks.Go(func() { o.reapJob(ctx, o.log.With(slog.String("job_id", id)), id) })
	}
}

// sweep enforces, every SweepInterval until ctx ends, what a dead
// worker no longer can: no sandbox on this host outlives its wall-clock
// limit, and none of a worker whose lease lapsed stays. A sandbox of this
// worker, or of a worker that holds its lease (or whose lease cannot be
// checked), is left to its worker until its limit is past. A backend that
// cannot sweep says so to the first pass, which ends the loop.
func (o *ownership) sweep(ctx context.Context) {
	t := time.NewTicker(o.sweepAt)
	defer t.Stop()
	// An owner counts as gone once its lease has been missing for a whole
	// IDLease: a live worker re-takes a lease the store lost (Redis came back
	// empty) within IDLease/3.
	missingSince := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		seen := map[string]bool{}
		keep := func(owner string) bool {
			if owner == o.id || owner == "" {
				return true
			}
			if a, ok := seen[owner]; ok {
				return a
			}
			a, err := o.store.WorkerAlive(ctx, owner)
			switch {
			case err != nil:
				a = true
			case a:
				delete(missingSince, owner)
			default:
				now := o.clock.Now()
				since, ok := missingSince[owner]
				if !ok {
					since = now
					missingSince[owner] = since
				}
				a = now.Sub(since) < o.lease
			}
			seen[owner] = a
			return a
		}
		reaped, err := o.rt.ReapExpired(ctx, keep)
		if unsupported(err) {
			return
		}
		if err != nil && ctx.Err() == nil {
			o.log.WarnContext(ctx, "sweep expired sandboxes", slog.Any("error", err))
		}
		if len(reaped) > 0 {
			o.metrics.OrphanReaped(ctx, len(reaped))
		}
		for owner := range missingSince {
			if _, ok := seen[owner]; !ok {
				delete(missingSince, owner) // no sandbox of it left
			}
		}
	}
}
