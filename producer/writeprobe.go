package producer

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/blob"
)

// storeProbeInterval is how often, by default, the API checks that
// JetStream's store and the object store take writes
// (Config.StoreProbeInterval): with the probe's 1 s bound, /readyz turns
// within 3 s of a store refusing writes.
const storeProbeInterval = 2 * time.Second

// storeProbes check that JetStream's store and the object store take
// writes, for /readyz: a full disk refuses writes while the server still
// answers reads.
type storeProbes struct {
	cfg   *Config // StoreProbeInterval, Queue (its probe)
	js    jetstream.JetStream
	blobs *blob.Store
	queue *jobQueue // probed once its stream is set up
	log   *slog.Logger
	// writeState is "ok" while JetStream's store takes the probe's writes,
	// else what is wrong.
	writeState atomic.Pointer[string]
	// blobState is likewise the object store's.
	blobState atomic.Pointer[string]
}

// probeWrites writes the probe every StoreProbeInterval once the job stream
// is set up, until ctx ends, recording the result for /readyz.
func (p *storeProbes) probeWrites(ctx context.Context) {
	for {
		wait := p.cfg.StoreProbeInterval
		if p.queue.queueCheck() == "ok" {
			p.recordWrite(ctx, p.writeProbe(ctx))
			p.recordBlobWrite(ctx, p.blobProbe(ctx))
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
func (p *storeProbes) writeProbe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(p.cfg.StoreProbeInterval, time.Second))
	defer cancel()
	return p.cfg.Queue.ProbeWrite(ctx, p.js)
}

// blobProbe writes the object store's probe (blob.Store.ProbeWrite) within
// a bound. A failure while JetStream itself does not answer is the
// queue's check's to report (nil here): this one names a store that
// refuses writes while the server answers, a full disk's latched error.
func (p *storeProbes) blobProbe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, min(p.cfg.StoreProbeInterval, time.Second))
	err := p.blobs.ProbeWrite(pctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, aerr := p.js.AccountInfo(actx); aerr != nil {
		return nil
	}
	return err
}

// recordBlobWrite keeps the object store probe's result and logs a change.
func (p *storeProbes) recordBlobWrite(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	state := "ok"
	if err != nil {
		state = "unavailable: the object store " + p.blobs.Bucket() + " does not take writes: " + err.Error() +
			" (a full disk: free space, then restart the NATS server, which keeps refusing until it restarts)"
	}
	prev := p.blobState.Swap(&state)
	switch {
	case err != nil && (prev == nil || *prev == "ok"):
		p.log.ErrorContext(ctx, "the object store does not take writes; /readyz fails until it does", slog.Any("error", err))
	case err == nil && prev != nil && *prev != "ok":
		p.log.InfoContext(ctx, "the object store takes writes again")
	}
}

// blobCheck is the readiness state of the object store.
func (p *storeProbes) blobCheck() string {
	if p := p.blobState.Load(); p != nil {
		return *p
	}
	return "waiting: not probed yet"
}

// recordWrite keeps the probe's result and logs a change.
func (p *storeProbes) recordWrite(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	state := "ok"
	if err != nil {
		state = "unavailable: the store does not take writes: " + err.Error()
	}
	prev := p.writeState.Swap(&state)
	switch {
	case err != nil && (prev == nil || *prev == "ok"):
		p.log.ErrorContext(ctx, "JetStream's store does not take writes; /readyz fails until it does (a full disk needs space, and a NATS restart if the server latched the error)", slog.Any("error", err))
	case err == nil && prev != nil && *prev != "ok":
		p.log.InfoContext(ctx, "JetStream's store takes writes again")
	}
}

// writeCheck is the readiness state of JetStream's store.
func (p *storeProbes) writeCheck() string {
	if p := p.writeState.Load(); p != nil {
		return *p
	}
	return "waiting: not probed yet"
}
