package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// enqueueCallbackFor is how long enqueueCallback keeps trying before the
// caller hands the job message back (its redelivery finds the job terminal
// and enqueues again).
const enqueueCallbackFor = 10 * time.Second

// enqueueCallback queues the callback of an ended job that names a
// callback_url, on KILN_CALLBACKS with Nats-Msg-Id "callback-<id>": a job's
// callback is queued once however many deliveries of the job get here. It is
// called before the job's message is acked, so a worker dying in between
// leaves the job to a redelivery, which finds it terminal and calls this again.
func (rc *recorder) enqueueCallback(ctx context.Context, log *slog.Logger, m job.Message, endedAt time.Time) error {
	if m.Spec.CallbackURL == "" {
		return nil
	}
	data, err := json.Marshal(job.CallbackRequest{ID: m.ID, URL: m.Spec.CallbackURL, Tenant: m.Tenant, EndedAt: endedAt.UTC()})
	if err != nil {
		return fmt.Errorf("encode callback request: %w", err)
	}
	msg := nats.NewMsg(job.TenantCallbackSubject(tenantOf(m)))
	msg.Data = data
	msg.Header.Set(job.HeaderMsgID, "callback-"+m.ID)
	msg.Header.Set(job.HeaderJobID, m.ID)
	deadline := time.Now().Add(enqueueCallbackFor)
	delay := 100 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = rc.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(job.CallbackStreamName))
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			// No API has created the stream yet: the stream's settings are
			// the shared queue configuration, so any process may.
			if _, cerr := queue.EnsureCallbackStream(ctx, rc.js, rc.queue); cerr != nil {
				err = cerr
			} else {
				continue
			}
		}
		if time.Now().After(deadline) || !sleep(ctx, delay) {
			log.WarnContext(ctx, "queue callback; handing the job back", slog.Any("error", err))
			return fmt.Errorf("queue callback of job %s: %w", m.ID, err)
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// deref returns *p, or def when p is nil.
func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
