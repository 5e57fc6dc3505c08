package worker

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
)

// writeProbes probe whether JetStream's store, and the object store, take
// writes, and say so on /readyz.
type writeProbes struct {
	every   time.Duration // WriteProbe
	queue   queue.Config
	js      jetstream.JetStream
	ready   *readiness
	log     *slog.Logger
	objects *objectStore
}

// run writes the JetStream store probe every WriteProbe until ctx ends. A
// store that cannot write also refuses this worker's acks, so the worker
// says so on /readyz (checks.jetstream_store); it keeps pulling, since what
// it runs is recorded in the store of record and acked once writes work.
func (p *writeProbes) run(ctx context.Context) {
	onTicks(ctx, p.every, func() { p.once(ctx) })
}

// once writes the probes once and records the results: the queue's
// store (checkWrites) and the object store (checkObjectStore, which a job's
// long output and artifacts go to).
func (p *writeProbes) once(ctx context.Context) {
	p.objects.probe(ctx)
	pctx, cancel := context.WithTimeout(ctx, min(p.every, 2*time.Second))
	err := p.queue.ProbeWrite(pctx, p.js)
	cancel()
	if ctx.Err() != nil {
		return
	}
	prev := p.ready.snapshot()[checkWrites]
	if err != nil {
		p.ready.set(checkWrites, "unavailable: the store does not take writes: "+err.Error())
		if prev == okCheck || !strings.HasPrefix(prev, "unavailable") {
			p.log.ErrorContext(ctx, "JetStream's store does not take writes; acks fail until it does", slog.Any("error", err))
		}
		return
	}
	p.ready.set(checkWrites, okCheck)
	if strings.HasPrefix(prev, "unavailable") {
		p.log.InfoContext(ctx, "JetStream's store takes writes again")
	}
}

// probe writes the object store's probe (blob.Store.ProbeWrite) now and
// records the result on /readyz (checkObjectStore). It returns
// the error when the store refuses writes while JetStream itself answers:
// its file store hit a write error (a full disk) and latched it, and
// nothing will be stored there until the NATS server restarts with room.
// While NATS or JetStream does not answer at all, it returns nil: an
// outage, which passes, not a refusal.
func (o *objectStore) probe(ctx context.Context) error {
	if o.blobs == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, o.probeFor)
	defer cancel()
	err := o.blobs.ProbeWrite(pctx)
	if ctx.Err() != nil {
		return nil
	}
	prev := o.ready.snapshot()[checkObjectStore]
	if err == nil {
		o.ready.set(checkObjectStore, okCheck)
		if strings.HasPrefix(prev, "unavailable") {
			o.log.InfoContext(ctx, "the object store takes writes again")
		}
		return nil
	}
	if !o.nc.IsConnected() {
		return nil
	}
	actx, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	_, aerr := o.js.AccountInfo(actx)
	cancel2()
	if aerr != nil {
		return nil // JetStream does not answer: not this store's refusal
	}
	o.ready.set(checkObjectStore, "unavailable: the object store "+o.blobs.Bucket()+" does not take writes: "+err.Error()+
		" (a full disk: free space, then restart the NATS server, which keeps refusing until it restarts)")
	if !strings.HasPrefix(prev, "unavailable") {
		o.log.ErrorContext(ctx, "the object store does not take writes; jobs whose output it must keep fail as output_limit until it does",
			slog.String("bucket", o.blobs.Bucket()), slog.Any("error", err))
	}
	return err
}
