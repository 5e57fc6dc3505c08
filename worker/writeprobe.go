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

// probeWrite writes the probes once and records the results: the queue's
// store (checkWrites) and the object store (checkObjectStore, which a job's
// long output and artifacts go to).
func (w *Worker) probeWrite(ctx context.Context) {
	w.probeObjectStore(ctx)
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

// probeObjectStore writes the object store's probe (blob.Store.ProbeWrite)
// now and records the result on /readyz (checkObjectStore). It returns
// the error when the store refuses writes while JetStream itself answers:
// its file store hit a write error (a full disk) and latched it, and
// nothing will be stored there until the NATS server restarts with room.
// While NATS or JetStream does not answer at all, it returns nil: an
// outage, which passes, not a refusal.
func (w *Worker) probeObjectStore(ctx context.Context) error {
	if w.blobs == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, min(w.cfg.WriteProbe, 2*time.Second))
	defer cancel()
	err := w.blobs.ProbeWrite(pctx)
	if ctx.Err() != nil {
		return nil
	}
	prev := w.ready.snapshot()[checkObjectStore]
	if err == nil {
		w.ready.set(checkObjectStore, okCheck)
		if strings.HasPrefix(prev, "unavailable") {
			w.log.InfoContext(ctx, "the object store takes writes again")
		}
		return nil
	}
	if !w.cfg.NATS.IsConnected() {
		return nil
	}
	actx, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	_, aerr := w.js.AccountInfo(actx)
	cancel2()
	if aerr != nil {
		return nil // JetStream does not answer: not this store's refusal
	}
	w.ready.set(checkObjectStore, "unavailable: the object store "+w.blobs.Bucket()+" does not take writes: "+err.Error()+
		" (a full disk: free space, then restart the NATS server, which keeps refusing until it restarts)")
	if !strings.HasPrefix(prev, "unavailable") {
		w.log.ErrorContext(ctx, "the object store does not take writes; jobs whose output it must keep fail as output_limit until it does",
			slog.String("bucket", w.blobs.Bucket()), slog.Any("error", err))
	}
	return err
}
