package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/cache"
)

// storeWatch is the store as the worker's calls reach it: every call that
// must get through retries while the store is unreachable, and while it is
// the worker pulls no new job (up is false until a call or the probe gets
// an answer).
type storeWatch struct {
	store Store
	log   *slog.Logger
	probe time.Duration // StoreProbe
	// poll is how often a held delivery asks whether the lease holder is
	// done: often enough to take over soon after a lease (of AckWait) lapses.
	poll time.Duration
	ok   atomic.Bool // false while the store is unreachable: pull nothing new
}

func newStoreWatch(cfg *Config, log *slog.Logger) *storeWatch {
	s := &storeWatch{store: cfg.Store, log: log, probe: cfg.StoreProbe,
		poll: min(cfg.Heartbeat, cfg.Queue.AckWait/4, time.Second)}
	s.ok.Store(true)
	return s
}

// up reports whether the store answered the last call made to it.
func (s *storeWatch) up() bool { return s.ok.Load() }

// retry runs op until it succeeds, fails for a reason other than the
// store being unreachable, or ctx ends. While the store is down the worker
// pulls no new jobs; the message is kept alive by the heartbeat.
func (s *storeWatch) retry(ctx context.Context, log *slog.Logger, op func(context.Context) error) error {
	delay := 100 * time.Millisecond
	for {
		err := op(ctx)
		if !errors.Is(err, cache.ErrUnavailable) {
			// Any answer, "not found" included, means the store is back: a
			// store that came back without the job's record must not leave
			// the worker paused for want of a write that succeeds.
			s.ok.Store(true)
			return err
		}
		if s.ok.Swap(false) {
			log.WarnContext(ctx, "store unavailable; holding job and pausing pulls", slog.Any("error", err))
		}
		if !sleep(ctx, delay) {
			return fmt.Errorf("store unavailable and worker stopping: %w", err)
		}
		delay = min(delay*2, 3*time.Second)
	}
}

// retryWhileLeased runs op through retry, and again every poll while it
// fails with cache.ErrLeased (another attempt is running the job), telling
// waiting (when set) each time.
func (s *storeWatch) retryWhileLeased(ctx context.Context, log *slog.Logger, op func(context.Context) error, waiting func(error)) error {
	for {
		err := s.retry(ctx, log, op)
		if !errors.Is(err, cache.ErrLeased) {
			return err
		}
		if waiting != nil {
			waiting(err)
		}
		if !sleep(ctx, s.poll) {
			return fmt.Errorf("waiting for the attempt holding the lease: %w", context.Cause(ctx))
		}
	}
}

// run lifts the pause on pulls as soon as the store answers a PING, so a
// worker whose store came back (in any state, even empty, where no held
// job has a write left to make) resumes pulling within a probe interval.
func (s *storeWatch) run(ctx context.Context) {
	onTicks(ctx, s.probe, func() {
		if s.ok.Load() {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, s.probe)
		err := s.store.Ping(pctx)
		cancel()
		if err == nil && !s.ok.Swap(true) {
			s.log.InfoContext(ctx, "store answers again; resuming pulls")
		}
	})
}
