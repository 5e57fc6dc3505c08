package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// maxDeliveriesAdvisory is what JetStream publishes when a message runs out of deliveries.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// advisories hears JetStream's max-deliveries advisories and gives the
// jobs they name up.
type advisories struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	tasks   *tasks // the give-ups, which Run waits for
	results *recorder
	metrics *ktrace.Metrics
}

// watch records jobs whose deliveries ran out (for example a job
// that crashed its worker every time) as internal_error and removes their
// message, so nothing stays queued or running forever. Every worker of the
// fleet hears the advisory; the store's first-terminal-write-wins rule makes
// the duplicates harmless.
func (a *advisories) watch(ctx context.Context, runtime string) (*nats.Subscription, error) {
	// Every consumer of the runtime's ready jobs (one per shard).
	subject := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.*", job.ReadyStreamName)
	sub, err := a.nc.Subscribe(subject, func(m *nats.Msg) {
		var adv maxDeliveriesAdvisory
		if err := json.Unmarshal(m.Data, &adv); err != nil {
			a.log.Warn("undecodable max-deliveries advisory", slog.Any("error", err))
			return
		}
		if !queue.IsRuntimeConsumer(adv.Consumer, runtime) {
			return
		}
		// giveUp may wait for a live lease: never block the subscription.
		a.tasks.Go(func() { a.giveUp(ctx, adv) })
	})
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe %s: %w", subject, err)
	}
	return sub, nil
}

// giveUp records the job adv names as internal_error and deletes its
// message.
func (a *advisories) giveUp(ctx context.Context, adv maxDeliveriesAdvisory) {
	stream, err := a.js.Stream(ctx, job.ReadyStreamName)
	if err != nil {
		a.log.WarnContext(ctx, "max deliveries: open stream", slog.Any("error", err))
		return
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		// Another worker got there first and deleted it.
		return
	}
	var m job.Message
	if err := json.Unmarshal(raw.Data, &m); err != nil || !job.ValidID(m.ID) {
		_ = stream.DeleteMsg(ctx, adv.StreamSeq)
		return
	}
	log := a.log.With(slog.String("job_id", m.ID))
	res := job.Result{
		ID: m.ID, Status: job.StatusInternalError, Attempt: int(adv.Deliveries), TraceID: m.TraceID, CreatedAt: ptr(m.CreatedAt),
		Error: job.NewFailure(job.CategoryInternal, fmt.Sprintf("job was delivered %d times without finishing (its worker died or gave it back each time); giving up", adv.Deliveries)),
	}
	won, ok := a.results.record(ctx, log, m, res, true, nil)
	if !ok {
		return
	}
	if won {
		log.WarnContext(ctx, "deliveries exhausted; recorded internal_error", slog.Uint64("deliveries", adv.Deliveries))
		a.metrics.JobFinished(ctx, m.Spec.Runtime, string(res.Status), 0, time.Since(m.CreatedAt))
	}
	_ = stream.DeleteMsg(ctx, adv.StreamSeq)
}
