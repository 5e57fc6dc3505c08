package producer

import (
	"context"
	"log/slog"
	"time"
)

// storeProbeInterval is how often, by default, the API checks that
// JetStream's store and the object store take writes
// (Config.StoreProbeInterval): with the probe's 1 s bound, /readyz turns
// within 3 s of a store refusing writes.
const storeProbeInterval = 2 * time.Second

// probeWrites writes the probe every StoreProbeInterval once the job stream
// is set up, until ctx ends, recording the result for /readyz.
func (s *Server) probeWrites(ctx context.Context) {
	for {
		wait := s.cfg.StoreProbeInterval
		if s.queue.queueCheck() == "ok" {
			s.recordWrite(ctx, s.writeProbe(ctx))
			s.recordBlobWrite(ctx, s.blobProbe(ctx))
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
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.StoreProbeInterval, time.Second))
	defer cancel()
	return s.cfg.Queue.ProbeWrite(ctx, s.js)
}

// blobProbe writes the object store's probe (blob.Store.ProbeWrite) within
// a bound. A failure while JetStream itself does not answer is the
// queue's check's to report (nil here): this one names a store that
// refuses writes while the server answers, a full disk's latched error.
func (s *Server) blobProbe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, min(s.cfg.StoreProbeInterval, time.Second))
	err := s.blobs.ProbeWrite(pctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, aerr := s.js.AccountInfo(actx); aerr != nil {
		return nil
	}
	return err
}

// recordBlobWrite keeps the object store probe's result and logs a change.
func (s *Server) recordBlobWrite(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	state := "ok"
	if err != nil {
		state = "unavailable: the object store " + s.blobs.Bucket() + " does not take writes: " + err.Error() +
			" (a full disk: free space, then restart the NATS server, which keeps refusing until it restarts)"
	}
	prev := s.blobState.Swap(&state)
	switch {
	case err != nil && (prev == nil || *prev == "ok"):
		s.log.ErrorContext(ctx, "the object store does not take writes; /readyz fails until it does", slog.Any("error", err))
	case err == nil && prev != nil && *prev != "ok":
		s.log.InfoContext(ctx, "the object store takes writes again")
	}
}

// blobCheck is the readiness state of the object store.
func (s *Server) blobCheck() string {
	if p := s.blobState.Load(); p != nil {
		return *p
	}
	return "waiting: not probed yet"
}

// recordWrite keeps the probe's result and logs a change.
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
