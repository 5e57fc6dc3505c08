package producer

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// queueDepthInterval is how often the API polls the stream and consumers
// for the queue gauges, by default (Config.QueueDepthInterval).
const queueDepthInterval = 5 * time.Second

// pollQueueDepth feeds the queue gauges (messages in the stream; pending,
// ack-pending and redelivered per runtime, summed over the runtime's
// consumers) from a poll every Config.QueueDepthInterval until ctx ends, so
// a scrape never waits on NATS.
func (q *jobQueue) pollQueueDepth(ctx context.Context) {
	if q.metrics == nil {
		return
	}
	var mu sync.Mutex
	var last ktrace.QueueDepth
	var have bool
	reg, err := q.metrics.RegisterQueueDepth(func() (ktrace.QueueDepth, bool) {
		mu.Lock()
		defer mu.Unlock()
		return last, have
	})
	if err != nil {
		q.log.WarnContext(ctx, "queue gauges", slog.Any("error", err))
		return
	}
	q.bg.Go(func() error {
		defer func() { _ = reg.Unregister() }()
		t := time.NewTicker(q.cfg.QueueDepthInterval)
		defer t.Stop()
		for {
			if d, err := q.queueDepth(ctx); err == nil {
				mu.Lock()
				last, have = d, true
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	})
}

func (q *jobQueue) queueDepth(ctx context.Context) (ktrace.QueueDepth, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	jobs, err := q.js.Stream(ctx, job.StreamName)
	if err != nil {
		return ktrace.QueueDepth{}, err
	}
	backlog, err := queue.Backlog(ctx, jobs)
	if err != nil {
		return ktrace.QueueDepth{}, err
	}
	d := ktrace.QueueDepth{Consumers: map[string]ktrace.ConsumerDepth{}}
	for rt, n := range backlog {
		d.Consumers[rt] = ktrace.ConsumerDepth{Pending: int64(n)}
		d.Messages += int64(n)
	}
	// Jobs taken off their backlog for a free slot wait in the ready stream
	// (a few at most), then run there until acked; the workers may not
	// have made it yet.
	ready, err := q.js.Stream(ctx, job.ReadyStreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return d, nil
	}
	if err != nil {
		return d, err
	}
	lister := ready.ListConsumers(ctx)
	for ci := range lister.Info() {
		rt, ok := consumerRuntime(ci)
		if !ok {
			continue
		}
		c := d.Consumers[rt]
		c.Pending += int64(ci.NumPending)
		c.AckPending += int64(ci.NumAckPending)
		c.Redelivered += int64(ci.NumRedelivered)
		d.Consumers[rt] = c
		d.Messages += int64(ci.NumPending + uint64(ci.NumAckPending))
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return d, err
	}
	return d, nil
}

// consumerRuntime is the runtime a consumer of the ready stream serves
// (subjects kiln.ready.<runtime>.<shard>.>): its shards count toward one
// runtime, so the gauges' runtime label is one series per runtime, whatever
// the number of tenants and shards.
func consumerRuntime(ci *jetstream.ConsumerInfo) (string, bool) {
	rest, ok := strings.CutPrefix(ci.Config.FilterSubject, job.ReadySubjectPrefix)
	if !ok {
		return "", false
	}
	rt, _, _ := strings.Cut(rest, ".")
	return rt, rt != "" && queue.IsRuntimeConsumer(ci.Name, rt)
}
