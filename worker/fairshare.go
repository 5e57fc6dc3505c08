package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// idlePoll is how often an idle worker looks at the queue when no wake-up
// came: the bound on a job's extra wait when its wake-up was lost.
const idlePoll = time.Second

// jobSource is where one runtime's jobs come from: a queue.Picker (fair
// turns across tenants) woken by the API's wake-ups on job.WorkSubject.
type jobSource struct {
	picker *queue.Picker
	wake   chan struct{}
	sub    *nats.Subscription
}

func (w *Worker) newJobSource(rt string) (*jobSource, error) {
	src := &jobSource{picker: queue.NewPicker(w.js, w.cfg.Queue, rt), wake: make(chan struct{}, 1)}
	sub, err := w.cfg.NATS.Subscribe(job.WorkSubject(rt), func(*nats.Msg) {
		select {
		case src.wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe %s: %w", job.WorkSubject(rt), err)
	}
	src.sub = sub
	return src, nil
}

func (s *jobSource) close() { _ = s.sub.Unsubscribe() }

// next returns the next message in fair order, waiting up to wait for one;
// (nil, nil) when none came.
func (s *jobSource) next(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		// Drop a stale wake-up: the scan below sees everything it announced.
		select {
		case <-s.wake:
		default:
		}
		msg, err := s.picker.Next(ctx)
		if msg != nil || err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil, nil
			}
			return msg, err
		}
		poll := time.NewTimer(idlePoll)
		select {
		case <-ctx.Done():
			poll.Stop()
			return nil, nil
		case <-deadline.C:
			poll.Stop()
			return nil, nil
		case <-s.wake:
		case <-poll.C:
		}
		poll.Stop()
	}
}

// tenantOf is the tenant a job is charged to; messages from before tenants
// existed belong to the dev-mode tenant.
func tenantOf(m job.Message) string {
	if m.Tenant == "" {
		return job.DefaultTenant
	}
	return m.Tenant
}
