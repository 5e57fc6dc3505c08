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
// Each tenant's jobs wait on their own subject of the job stream
// (job.TenantJobSubject), its backlog, which no consumer reads. For every
// free slot, Next takes the first tenant holding jobs after the one it
// served last, in a fixed order (round-robin over the tenants with work
// waiting), moves that tenant's oldest job to the ready stream unless the
// tenant is at its running-jobs bound (promote, ready.go), and fetches one
// job from the ready stream's consumer of its runtime and shard, shared by
// the whole fleet. A tenant with 10,000 jobs queued therefore gets one slot
// in turn like a tenant with one, and a newcomer's job waits at most for the
// next slot to free up, with no consumer per tenant. A worker serving
// several runtimes lists the subjects once for all of them (a Lister) and
// gives each runtime's Picker the answer (NextAmong); a worker's Lister
// keeps its listing a short while (NewCachedLister).
//
// A Picker is not safe for concurrent use; a worker has one per runtime.
type Picker struct {
	js      jetstream.JetStream
	cfg     Config
	runtime string
	lister  *Lister
	ready   map[int]jetstream.Consumer // by shard
	last    string                     // subject served last
	shard   int                        // the shard takeReady starts with
}

// promotedWait bounds the wait for a job from the ready stream once this
// worker has moved one there: it is there at once, unless another worker
// took it first.
const promotedWait = 500 * time.Millisecond

// NewPicker returns a Picker for runtime's jobs.
func NewPicker(js jetstream.JetStream, cfg Config, runtime string) *Picker {
	return NewLister(js).NewPicker(cfg, runtime)
}

// Next returns the next job message in fair order, or nil when no tenant
// has a job that can run now (none queued, or every tenant with jobs at its
// running-jobs bound). It does not wait for jobs to come.
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
	// Round-robin: start after the subject served last.
	start, _ := slices.BinarySearch(subjects, p.last)
	if start < len(subjects) && subjects[start] == p.last {
		start++
	}
	var errs []error
	for i := range subjects {
		subj := subjects[(start+i)%len(subjects)]
		msg, moved, err := p.take(ctx, subj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if msg != nil {
			return msg, nil
		}
		if moved {
			// Another worker took the job moved for this slot: what is
			// left in the ready stream is taken below.
			break
		}
	}
	// Nothing moved (every tenant with jobs at its bound), or the job moved
	// went to another worker: a job already in the ready stream is taken (a
	// redelivery after its worker was lost, or one moved by a worker that
	// went away before fetching it).
	msg, err := p.takeReady(ctx)
	if msg != nil || err != nil {
		return msg, err
	}
	if len(subjects) > 0 && len(errs) == len(subjects) {
		return nil, errors.Join(errs...)
	}
	return nil, nil
}

// take is one tenant's turn: its oldest job moved to the ready stream, and
// a job fetched from the ready stream's consumer of that tenant's shard.
// moved reports whether a job was moved; a subject with nothing to move
// (none queued, or its tenant at its running-jobs bound) leaves a cached
// listing until a hint brings it back.
func (p *Picker) take(ctx context.Context, subject string) (msg jetstream.Msg, moved bool, err error) {
	jobs, err := p.lister.jobs(ctx)
	if err != nil {
		return nil, false, err
	}
	shard := ShardOf(tokenOf(p.runtime, subject), p.cfg.withDefaults().Shards)
	// Bound first: the ready stream is made with its first consumer.
	if _, err := p.consumer(ctx, shard); err != nil {
		return nil, false, err
	}
	what, err := promote(ctx, jobs, p.js, p.runtime, subject, shard)
	if err != nil {
		return nil, false, err
	}
	if what == raced {
		// The tenant may have more queued: its subject stays listed.
		return nil, false, nil
	}
	if what != promoted {
		p.lister.drop(subject)
		return nil, false, nil
	}
	p.last = subject
	msg, err = p.fetch(ctx, shard, promotedWait)
	return msg, true, err
}

// takeReady takes a job from the ready stream without waiting, from each of
// the runtime's shards in turn.
func (p *Picker) takeReady(ctx context.Context) (jetstream.Msg, error) {
	n := p.cfg.withDefaults().Shards
	for i := range n {
		shard := (p.shard + i) % n
		msg, err := p.fetch(ctx, shard, 0)
		if msg != nil || err != nil {
			p.shard = (shard + 1) % n
			return msg, err
		}
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

// Lister lists the job stream's subjects that hold messages (the tenants
// with jobs queued), for every runtime's Picker at once. Its methods are for
// one goroutine, but for Hint and Invalidate, which any goroutine may call.
//
// A Lister made by NewCachedLister keeps a listing for up to its maxAge
// instead of asking the stream for each free slot (a stream-info request
// whose answer names every subject holding messages). The listing is kept
// true between requests by what the worker learns anyway:
//   - the API's wake-up names the subject it has just published a job on
//     (Hint), so a tenant with a new job is in the next scan;
//   - a subject with nothing to move to the ready stream is dropped: its
//     jobs were taken, or its tenant is at its running-jobs bound;
//   - the worker hints a job's subject again as the job settles: its tenant
//     may have more jobs, held back by that bound until now;
//   - a wake-up that names no subject (an API of an earlier version), or a
//     scan that did not find the job its wake-up announced, asks the
//     stream again (Invalidate).
//
// What is left to the listing's age: a tenant's bound freed by a job ending
// on another worker is seen up to maxAge late. (A job handed back or
// redelivered is in the ready stream, which every scan looks at.)
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
	return &Picker{js: l.js, cfg: cfg, runtime: runtime, lister: l, ready: map[int]jetstream.Consumer{}}
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

// jobs is the job stream (the tenants' backlogs).
func (l *Lister) jobs(ctx context.Context) (jetstream.Stream, error) {
	if l.stream == nil {
		s, err := l.js.Stream(ctx, job.StreamName)
		if err != nil {
			return nil, fmt.Errorf("open stream %s: %w", job.StreamName, err)
		}
		l.stream = s
	}
	return l.stream, nil
}

// list asks the stream.
func (l *Lister) list(ctx context.Context) ([]string, error) {
	stream, err := l.jobs(ctx)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(job.SubjectPrefix+">"))
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

// fetch takes one job from the ready stream's consumer of shard, waiting
// up to wait for one (0: not at all).
func (p *Picker) fetch(ctx context.Context, shard int, wait time.Duration) (jetstream.Msg, error) {
	cons, err := p.consumer(ctx, shard)
	if err != nil {
		return nil, err
	}
	var batch jetstream.MessageBatch
	if wait > 0 {
		fctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		batch, err = cons.Fetch(1, jetstream.FetchContext(fctx))
	} else {
		batch, err = cons.FetchNoWait(1)
	}
	if err != nil {
		delete(p.ready, shard) // bind again next time, in case it was deleted
		return nil, fmt.Errorf("fetch from %s: %w", RunConsumerName(p.runtime, shard), err)
	}
	for m := range batch.Messages() {
		return m, nil
	}
	return nil, nil
}

// consumer binds the ready consumer of shard, creating it (and the ready
// stream) with this worker's settings if no worker has (the fleet's queue
// owner keeps their settings: owner.go).
func (p *Picker) consumer(ctx context.Context, shard int) (jetstream.Consumer, error) {
	if c, ok := p.ready[shard]; ok {
		return c, nil
	}
	c, err := bindConsumer(ctx, p.js, job.ReadyStreamName, p.cfg.RunConsumerConfig(p.runtime, shard))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err = EnsureReadyStream(ctx, p.js, p.cfg); err == nil {
			c, err = bindConsumer(ctx, p.js, job.ReadyStreamName, p.cfg.RunConsumerConfig(p.runtime, shard))
		}
	}
	if err != nil {
		return nil, err
	}
	p.ready[shard] = c
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
