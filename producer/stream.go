package producer

import (
	"context"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/queue"
)

// setUpStream creates or updates the job stream (the API owns its
// settings), the object store and the event stream. When NATS is not reachable yet (the API started before it), it
// keeps trying in the background with back-off until ctx ends; until then
// /readyz reports the queue as waiting and submissions answer 503.
func (q *jobQueue) setUpStream(ctx context.Context) {
	if q.nc.IsConnected() && q.tryStream(ctx) == nil {
		return
	}
	q.bg.Go(func() error {
		delay := 200 * time.Millisecond
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			if q.tryStream(ctx) == nil {
				q.log.InfoContext(ctx, "job stream set up", slog.String("stream", q.cfg.Queue.StreamConfig().Name))
				return nil
			}
			delay = min(delay*2, 5*time.Second)
		}
	})
}

func (q *jobQueue) tryStream(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := queue.CheckServerVersion(q.nc)
	if err == nil {
		_, err = queue.EnsureStreamOwned(cctx, q.js, q.cfg.Queue, q.log)
	}
	if err == nil {
		// The object store (artifacts, inputs by reference) and the live
		// event stream are set up with the job stream.
		err = q.blobs.Setup(cctx)
	}
	if err == nil {
		_, err = events.Ensure(cctx, q.js, q.cfg.Events)
	}
	state := "ok"
	if err != nil {
		state = "unavailable: " + err.Error()
		q.log.WarnContext(ctx, "set up the job stream; retrying", slog.Any("error", err))
	}
	q.state.Store(&state)
	return err
}

// queueCheck is the readiness state of the job stream.
func (q *jobQueue) queueCheck() string {
	if p := q.state.Load(); p != nil {
		return *p
	}
	return "waiting: not set up yet"
}
