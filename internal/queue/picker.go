package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// Picker takes a runtime's jobs off the queue in fair turns across tenants.
//
// Each tenant's jobs are published on their own subject
// (job.TenantJobSubject) and consumed through their own durable consumer
// (TenantConsumerName), shared by the fleet. For every free slot, Next asks
// the stream which of the runtime's subjects hold messages, and fetches one
// message from the first of those tenants after the one it served last, in
// a fixed order: round-robin over tenants with work waiting. A tenant with
// 10,000 jobs queued therefore gets one slot in turn like a tenant with one,
// and a newcomer's job waits at most for the next slot to free up. A worker
// serving several runtimes asks the stream once for all of them (a Lister)
// and gives each runtime's Picker the answer (NextAmong).
//
// A Picker is not safe for concurrent use; a worker has one per runtime.
type Picker struct {
	js        jetstream.JetStream
	cfg       Config
	runtime   string
	lister    *Lister
	consumers map[string]jetstream.Consumer // by subject
	last      string                        // subject served last
}

// NewPicker returns a Picker for runtime's jobs.
func NewPicker(js jetstream.JetStream, cfg Config, runtime string) *Picker {
	return &Picker{js: js, cfg: cfg, runtime: runtime, lister: NewLister(js), consumers: map[string]jetstream.Consumer{}}
}

// Next returns the next job message in fair order, or nil when no tenant
// has a message that can be delivered now (none queued, or every tenant
// with messages at its running-jobs bound). It does not wait.
func (p *Picker) Next(ctx context.Context) (jetstream.Msg, error) {
	all, err := p.lister.Waiting(ctx)
	if err != nil {
		return nil, err
	}
	return p.NextAmong(ctx, all)
}

// NextAmong is Next with the job stream's subjects that hold messages
// already listed (Lister.Waiting, sorted, every runtime's).
func (p *Picker) NextAmong(ctx context.Context, all []string) (jetstream.Msg, error) {
	subjects := p.own(all)
	if len(subjects) == 0 {
		return nil, nil
	}
	// Round-robin: start after the subject served last.
	start, _ := slices.BinarySearch(subjects, p.last)
	if start < len(subjects) && subjects[start] == p.last {
		start++
	}
	var errs []error
	for i := range subjects {
		subj := subjects[(start+i)%len(subjects)]
		msg, err := p.fetch(ctx, subj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if msg != nil {
			p.last = subj
			return msg, nil
		}
	}
	if len(errs) == len(subjects) {
		return nil, errors.Join(errs...)
	}
	return nil, nil
}

// own picks, in order, the runtime's subjects out of all: its tenants'
// subjects and the runtime-wide one (messages published without a tenant
// take their turns too).
func (p *Picker) own(all []string) []string {
	legacy := job.JobSubject(p.runtime)
	var out []string
	for _, subj := range all {
		tok, tenant := strings.CutPrefix(subj, legacy+".")
		if subj == legacy || (tenant && tok != "" && !strings.Contains(tok, ".")) {
			out = append(out, subj)
		}
	}
	return out
}

// Lister lists the job stream's subjects that hold messages, for every
// runtime's Picker at once. It is not safe for concurrent use.
type Lister struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// NewLister returns a Lister of js's job stream.
func NewLister(js jetstream.JetStream) *Lister { return &Lister{js: js} }

// Waiting lists, sorted, the subjects of every runtime's jobs holding
// messages (queued, or delivered and not yet acked): one request.
func (l *Lister) Waiting(ctx context.Context) ([]string, error) {
	if l.stream == nil {
		s, err := l.js.Stream(ctx, job.StreamName)
		if err != nil {
			return nil, fmt.Errorf("open stream %s: %w", job.StreamName, err)
		}
		l.stream = s
	}
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(job.SubjectPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("list subjects of %s: %w", job.StreamName, err)
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		out = append(out, subj)
	}
	slices.Sort(out)
	return out, nil
}

// fetch takes one message from subject's consumer without waiting.
func (p *Picker) fetch(ctx context.Context, subject string) (jetstream.Msg, error) {
	cons, err := p.consumer(ctx, subject)
	if err != nil {
		return nil, err
	}
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		delete(p.consumers, subject) // bind again next time, in case it was deleted
		return nil, fmt.Errorf("fetch from %s: %w", subject, err)
	}
	for m := range batch.Messages() {
		return m, nil
	}
	// An error here is typically "Exceeded MaxAckPending": the tenant is at
	// its running-jobs bound, so its turn passes.
	return nil, nil
}

// consumer binds the consumer of subject, creating it (without a
// running-jobs bound) if the API has not, and giving it this worker's
// delivery settings (AckWait, MaxDeliver, BackOff: the fleet's shared
// setting) while keeping the bound the API set.
func (p *Picker) consumer(ctx context.Context, subject string) (jetstream.Consumer, error) {
	if c, ok := p.consumers[subject]; ok {
		return c, nil
	}
	var cc jetstream.ConsumerConfig
	if subject == job.JobSubject(p.runtime) {
		cc = p.cfg.ConsumerConfig(p.runtime)
	} else {
		cc = p.cfg.TenantConsumerConfig(p.runtime, subject[strings.LastIndexByte(subject, '.')+1:], 0)
	}
	c, err := bindConsumer(ctx, p.js, cc, func(cur *jetstream.ConsumerConfig) bool {
		if cur.AckWait == cc.AckWait && cur.MaxDeliver == cc.MaxDeliver && slices.Equal(cur.BackOff, cc.BackOff) {
			return false
		}
		cur.AckWait, cur.MaxDeliver, cur.BackOff = cc.AckWait, cc.MaxDeliver, cc.BackOff
		return true
	})
	if err != nil {
		return nil, err
	}
	p.consumers[subject] = c
	return c, nil
}

// Wait is Next asked again every pollEvery until a message comes or ctx
// ends (then it returns ctx's error). For tests and tools that act as a
// worker for one job.
func (p *Picker) Wait(ctx context.Context) (jetstream.Msg, error) {
	for {
		msg, err := p.Next(ctx)
		if msg != nil || err != nil {
			return msg, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

const pollEvery = 20 * time.Millisecond
