package producer

import (
	"context"
	"log/slog"
	"time"
)

// storeProbeInterval is how often, by default, the API checks that
// JetStream's store takes writes (Config.StoreProbeInterval).
const storeProbeInterval = 5 * time.Second

// probeWrites writes the probe every StoreProbeInterval once the job stream
// is set up, until ctx ends, recording the outcome for /readyz.
func (s *Server) probeWrites(ctx context.Context) {
	for {
		wait := s.cfg.StoreProbeInterval
		if s.queueCheck() == "ok" {
			s.recordWrite(ctx, s.writeProbe(ctx))
		} else {
			wait = min(wait, 200*time.Millisecond) // the stream is being set up: probe soon after
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// writeProbe writes the probe (queue.Config.ProbeWrite) within a bound.
func (s *Server) writeProbe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.StoreProbeInterval, 2*time.Second))
	defer cancel()
	return s.cfg.Queue.ProbeWrite(ctx, s.js)
}

// recordWrite keeps the probe's outcome and logs a change.
func (s *Server) recordWrite(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	state := "ok"
	if err != nil {
		state = "unavailable: the store does not take writes: " + err.Error()
	}
	prev := s.writeState.Swap(&state)
	switch {
	case err != nil && (prev == nil || *prev == "ok"):
		s.log.ErrorContext(ctx, "JetStream's store does not take writes; /readyz fails until it does (a full disk needs space, and a NATS restart if the server latched the error)", slog.Any("error", err))
	case err == nil && prev != nil && *prev != "ok":
		s.log.InfoContext(ctx, "JetStream's store takes writes again")
	}
}

// writeCheck is the readiness state of JetStream's store.
func (s *Server) writeCheck() string {
	if p := s.writeState.Load(); p != nil {
		return *p
	}
	return "waiting: not probed yet"
}
