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

// wakeRescans are the pauses before the scans that follow a wake-up whose
// job the first scan did not find (another worker took it, or the listing
// had dropped its tenant's subject): each asks the stream again. A scan
// that still finds nothing after them leaves the job to the next wake-up or
// the idle poll (a tenant at its running-jobs bound, a job another worker
// took).
var wakeRescans = []time.Duration{2 * time.Millisecond, 8 * time.Millisecond, 32 * time.Millisecond}

// listingMaxAge is how long the worker keeps its listing of the subjects
// holding jobs (queue.NewCachedLister): the most a job handed back to a
// tenant whose subject was found empty waits beyond its delay.
const listingMaxAge = 250 * time.Millisecond

// jobSource is where the worker's jobs come from: one queue.Picker per
// runtime (fair turns across tenants), taken in turn across runtimes, and
// woken by the API's wake-ups on each runtime's job.WorkSubject. One source
// serves every runtime, so a free slot goes to whichever runtime has a job:
// a slot is never held waiting on a runtime whose queue is empty while
// another runtime's job waits.
type jobSource struct {
	lister  *queue.Lister // one listing of waiting subjects per scan, for every picker
	pickers []*queue.Picker
	turn    int // the picker the next scan starts with
	wake    chan struct{}
	subs    []*nats.Subscription
	// scanOnce looks at every runtime's queue once (scan; a test's fake);
	// idle is idlePoll.
	scanOnce func(context.Context) (jetstream.Msg, error)
	idle     time.Duration
}

// newJobSource is the source of runtimes' jobs from the queue js holds (q
// its settings), woken on nc.
func newJobSource(js jetstream.JetStream, nc *nats.Conn, q queue.Config, clock Clock, runtimes []string) (*jobSource, error) {
	lister := queue.NewCachedLister(js, listingMaxAge, clock.Now)
	src := &jobSource{lister: lister, wake: make(chan struct{}, 1), idle: idlePoll}
	src.scanOnce = src.scan
	for _, rt := range runtimes {
		src.pickers = append(src.pickers, lister.NewPicker(q, rt))
		sub, err := nc.Subscribe(job.WorkSubject(rt), func(m *nats.Msg) {
			// The wake-up names the tenant subject the job was published
			// on; one that does not (an API of an earlier version) has the
			// next scan ask the stream.
			if subj := string(m.Data); job.IsTenantJobSubject(rt, subj) {
				lister.Hint(subj)
			} else {
				lister.Invalidate()
			}
			select {
			case src.wake <- struct{}{}:
			default:
			}
		})
		if err != nil {
			src.close()
			return nil, fmt.Errorf("worker: subscribe %s: %w", job.WorkSubject(rt), err)
		}
		src.subs = append(src.subs, sub)
	}
	return src, nil
}

func (s *jobSource) close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
}

// scan lists the subjects holding messages once, then takes the next
// message of the first runtime, in turn, that has one: a tenant's next job,
// or one already in the ready stream (handed back, or redelivered after its
// worker was lost), which no backlog lists.
func (s *jobSource) scan(ctx context.Context) (jetstream.Msg, error) {
	all, err := s.lister.Waiting(ctx)
	if err != nil {
		return nil, err
	}
	n := len(s.pickers)
	for i := range n {
		p := s.pickers[(s.turn+i)%n]
		msg, err := p.NextAmong(ctx, all)
		if msg != nil || err != nil {
			s.turn = (s.turn + i + 1) % n
			return msg, err
		}
	}
	return nil, nil
}

// next returns the next message in fair order, waiting up to wait for one;
// (nil, nil) when none came.
func (s *jobSource) next(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var rescans []time.Duration // left of wakeRescans after the last wake-up
	for {
		// Drop a stale wake-up: the scan below sees everything it announced.
		select {
		case <-s.wake:
		default:
		}
		msg, err := s.scanOnce(ctx)
		if msg != nil || err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil, nil
			}
			return msg, err
		}
		pause := s.idle
		if len(rescans) > 0 {
			pause, rescans = rescans[0], rescans[1:]
			// The job the wake-up announced was not found: its subject
			// may have been dropped as empty before the tenant's consumer
			// knew of it, so the rescan asks the stream.
			if s.lister != nil {
				s.lister.Invalidate()
			}
		}
		poll := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			poll.Stop()
			return nil, nil
		case <-deadline.C:
			poll.Stop()
			return nil, nil
		case <-s.wake:
			rescans = wakeRescans
		case <-poll.C:
		}
		poll.Stop()
	}
}

// settled tells the source that a job of subject was acked or handed back.
func (s *jobSource) settled(subject string) {
	if s.lister != nil {
		s.lister.Hint(subject)
	}
}

// tenantOf is the tenant a job is charged to.
func tenantOf(m job.Message) string { return m.TenantOrDefault() }
