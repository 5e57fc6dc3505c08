package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
// and gives each runtime's Picker the answer (NextAmong); a worker's Lister
// keeps its listing a short while (NewCachedLister).
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
	return NewLister(js).NewPicker(cfg, runtime)
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
// runtime's Picker at once. Its methods are for one goroutine, but for Hint
// and Invalidate, which any goroutine may call.
//
// A Lister made by NewCachedLister keeps a listing for up to its maxAge
// instead of asking the stream for each free slot (a stream-info request
// whose answer names every subject holding messages: at saturation, the
// largest JetStream cost a job had after its own messages). The listing is
// kept true between requests by what the worker learns anyway:
//   - the API's wake-up names the subject it has just published a job on
//     (Hint), so a tenant with a new job is in the next scan, as it was;
//   - a subject a fetch finds nothing to deliver on is dropped: its jobs
//     were taken, or its tenant is at its running-jobs bound (JetStream
//     holds a no-wait fetch of a tenant at its bound until the client
//     gives up, a second later, empty-handed);
//   - the worker hints a job's subject again as the job settles: its tenant
//     may have more jobs, held back by that bound until now;
//   - a wake-up that names no subject (an API of an earlier version), or a
//     scan that did not find the job its wake-up announced, asks the
//     stream again (Invalidate).
//
// What is left to the listing's age: a job that becomes deliverable with no
// hint (a nak's delay or a lost worker's ack wait ending, a bound freed by
// another worker) on a subject that was dropped is seen up to maxAge late.
type Lister struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	maxAge time.Duration
	now    func() time.Time

	listed   []string // sorted; never modified in place (callers hold it)
	listedAt time.Time

	mu    sync.Mutex
	hints []string
	stale bool
}

// NewLister returns a Lister of js's job stream that asks the stream on
// every call.
func NewLister(js jetstream.JetStream) *Lister { return NewCachedLister(js, 0, nil) }

// NewCachedLister returns a Lister that keeps its listing for up to
// maxAge on the clock now (nil: the wall clock).
func NewCachedLister(js jetstream.JetStream, maxAge time.Duration, now func() time.Time) *Lister {
	if now == nil {
		now = time.Now
	}
	return &Lister{js: js, maxAge: maxAge, now: now, stale: true}
}

// NewPicker returns a Picker for runtime's jobs that lists through l (and
// drops from l's listing the subjects it finds empty).
func (l *Lister) NewPicker(cfg Config, runtime string) *Picker {
	return &Picker{js: l.js, cfg: cfg, runtime: runtime, lister: l, consumers: map[string]jetstream.Consumer{}}
}

// Hint adds subject to the listing: a job was just published on it.
func (l *Lister) Hint(subject string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.hints) < maxHints {
		l.hints = append(l.hints, subject)
	} else {
		l.stale = true
	}
}

// maxHints bounds the hints kept between two scans; past it, the next
// scan asks the stream.
const maxHints = 1024

// Invalidate makes the next Waiting ask the stream.
func (l *Lister) Invalidate() {
	l.mu.Lock()
	l.stale = true
	l.mu.Unlock()
}

// Waiting lists, sorted, the subjects of every runtime's jobs holding
// messages (queued, or delivered and not yet acked): one request, or none
// while a cached listing is young enough. The slice is the caller's to
// read, not to change.
func (l *Lister) Waiting(ctx context.Context) ([]string, error) {
	l.mu.Lock()
	hints, stale := l.hints, l.stale
	l.hints, l.stale = nil, false
	l.mu.Unlock()
	if stale || l.maxAge <= 0 || l.now().Sub(l.listedAt) >= l.maxAge {
		listed, err := l.list(ctx)
		if err != nil {
			l.Invalidate() // the hints are in the next listing
			return nil, err
		}
		l.listed, l.listedAt = listed, l.now()
	}
	for _, h := range hints {
		if i, found := slices.BinarySearch(l.listed, h); !found {
			l.listed = slices.Insert(slices.Clip(l.listed), i, h)
		}
	}
	return l.listed, nil
}

// drop removes subject from the listing: a fetch found nothing to deliver.
func (l *Lister) drop(subject string) {
	if i, found := slices.BinarySearch(l.listed, subject); found {
		l.listed = slices.Delete(slices.Clone(l.listed), i, i+1)
	}
}

// list asks the stream.
func (l *Lister) list(ctx context.Context) ([]string, error) {
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
	// Nothing to deliver: none queued ("no messages"), or the tenant at its
	// running-jobs bound (the fetch gave up after a second), so its turn
	// passes and its subject leaves a cached listing until a hint brings it
	// back.
	p.lister.drop(subject)
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
