package producer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// eventsPullBatch is the most events fetched at once for one stream.
const eventsPullBatch = 64

// followEvents fetches a job's events from cons, one batch of at most
// eventsPullBatch events and eventsPullBytes at a time, and hands them over one by one; the next batch
// is asked for only once the last is handed over. The channel is closed
// when ctx ends or the consumer fails.
func (e *eventStreams) followEvents(ctx context.Context, id string, cons jetstream.Consumer) <-chan jetstream.Msg {
	msgs := make(chan jetstream.Msg)
	go func() {
		defer close(msgs)
		for ctx.Err() == nil {
			fctx, cancel := context.WithTimeout(ctx, eventsFetchWait)
			// Fetch, not FetchBytes: FetchBytes sizes its channel for a
			// million messages (16 MB) whatever the bytes.
			batch, err := cons.Fetch(eventsPullBatch, jetstream.FetchMaxBytes(eventsPullBytes), jetstream.FetchContext(fctx))
			if err != nil {
				cancel()
				if ctx.Err() == nil {
					e.log.WarnContext(ctx, "follow job events", slog.String("job_id", id), slog.Any("error", err))
				}
				return
			}
			for m := range batch.Messages() {
				select {
				case msgs <- m:
				case <-ctx.Done():
				}
			}
			cancel()
			if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
				e.log.WarnContext(ctx, "follow job events", slog.String("job_id", id), slog.Any("error", err))
				return
			}
		}
	}()
	return msgs
}

// removeConsumer stops following and removes the stream's consumer from
// JetStream at once, on a context that outlives the request: a client that
// went away leaves nothing behind on the server.
func (e *eventStreams) removeConsumer(ctx context.Context, cons jetstream.Consumer, stop context.CancelFunc) {
	stop()
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := e.js.DeleteConsumer(dctx, job.EventsStreamName, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		e.log.DebugContext(ctx, "remove event stream consumer; it lapses by itself", slog.String("consumer", info.Name), slog.Any("error", err))
	}
}
