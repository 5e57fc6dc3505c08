package worker

import (
	"context"
	"log/slog"
	"strings"
	"time"
)

// probeWrites writes the JetStream store probe every WriteProbe until ctx
// ends. A store that cannot write also refuses this worker's acks, so the
// worker says so on /readyz (checks.jetstream_store); it keeps pulling, since
// what it runs is recorded in the store of record and acked once writes work.
func (w *Worker) probeWrites(ctx context.Context) {
	t := time.NewTicker(w.cfg.WriteProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.probeWrite(ctx)
	}
}

// probeWrite writes the probe once and records the outcome.
func (w *Worker) probeWrite(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, min(w.cfg.WriteProbe, 2*time.Second))
	err := w.cfg.Queue.ProbeWrite(pctx, w.js)
	cancel()
	if ctx.Err() != nil {
		return
	}
	prev := w.ready.snapshot()[checkWrites]
	if err != nil {
		w.ready.set(checkWrites, "unavailable: the store does not take writes: "+err.Error())
		if prev == okCheck || !strings.HasPrefix(prev, "unavailable") {
			w.log.ErrorContext(ctx, "JetStream's store does not take writes; acks fail until it does", slog.Any("error", err))
		}
		return
	}
	w.ready.set(checkWrites, okCheck)
	if strings.HasPrefix(prev, "unavailable") {
		w.log.InfoContext(ctx, "JetStream's store takes writes again")
	}
}
