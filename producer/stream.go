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
func (s *Server) setUpStream(ctx context.Context) {
	if s.nc.IsConnected() && s.tryStream(ctx) == nil {
		return
	}
	s.bg.Go(func() error {
		delay := 200 * time.Millisecond
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			if s.tryStream(ctx) == nil {
				s.log.InfoContext(ctx, "job stream set up", slog.String("stream", s.cfg.Queue.StreamConfig().Name))
				return nil
			}
			delay = min(delay*2, 5*time.Second)
		}
	})
}

func (s *Server) tryStream(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := queue.CheckServerVersion(s.nc)
	if err == nil {
		_, err = queue.EnsureStreamOwned(cctx, s.js, s.cfg.Queue, s.log)
	}
	if err == nil {
		// The object store (artifacts, inputs by reference) and the live
		// event stream are set up with the job stream.
		err = s.blobs.Setup(cctx)
	}
	if err == nil {
		_, err = events.Ensure(cctx, s.js, s.cfg.Events)
	}
	state := "ok"
	if err != nil {
		state = "unavailable: " + err.Error()
		s.log.WarnContext(ctx, "set up the job stream; retrying", slog.Any("error", err))
	}
	s.queueState.Store(&state)
	return err
}

// queueCheck is the readiness state of the job stream.
func (s *Server) queueCheck() string {
	if p := s.queueState.Load(); p != nil {
		return *p
	}
	return "waiting: not set up yet"
}
