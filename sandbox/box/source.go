package box

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The box source: which box a job gets, when a box is made and when one is
// retired. It holds the neutral boxes of each class and every tenant's idle
// boxes, keeps each class's neutral boxes ready (Config.Neutral), bounds
// the boxes (Config.Max) by retiring the least recently used idle box of
// any tenant, retires a box too old (Config.MaxAge) or ended when a job
// would take it, and backs off after a failed creation (RetryAfter). It
// makes and ends boxes through a Maker (the containerd backend's, package
// sandbox) and judges time by Config.Now, so its decisions are tested with
// a fake maker on a manual clock (source_test.go).

// Box is what the source needs of one box.
type Box interface {
	comparable
	// Prepared is when the box's supervisor became ready: its age is
	// judged from it.
	Prepared() time.Time
	// ExitedIdle reports whether the box's task ended while it sat idle.
	ExitedIdle() bool
	// LastUsed is when the box last served a job.
	LastUsed() time.Time
	// Claim makes a neutral box tenant's (its first job's).
	Claim(tenant string)
}

// Class is what a box must be made with and a job cannot change.
type Class interface {
	comparable
	// Runtime names the class's runtime (for logs).
	Runtime() string
}

// Maker makes and ends the boxes of a source; I is the image a box is
// made from.
type Maker[B Box, C Class, I any] interface {
	// MakeBox makes a box of class cls for img and returns it once its
	// supervisor is ready for jobs (Prepared set). On error the box it
	// returns, if not the zero B, is still to be ended.
	MakeBox(ctx context.Context, cls C, img I) (B, error)
	// EndBox stops and removes a box (never the zero B) the source let go.
	EndBox(ctx context.Context, b B)
}

// Config is what the source decides by.
type Config struct {
	// Max bounds the boxes, busy ones too; MaxAge is how long a box may
	// serve from when it became ready; Neutral is how many neutral boxes
	// each class keeps ready (at least one is made for a class asked for).
	Max     int
	MaxAge  time.Duration
	Neutral int
	// Wait makes a job that finds no box wait for one (Await) instead of
	// running in a container of its own.
	Wait bool
	// Now is the clock boxes are judged by. Default: time.Now.
	Now func() time.Time
}

// Stats are the source's figures.
type Stats struct {
	Idle, Neutral, Live                                int
	Hits, Claims, Misses, Retired, Prepared, Discarded int64
}

// RetryAfter is how long after a failed box no new one is tried.
const RetryAfter = 2 * time.Second

// Key is what a box serves: the jobs of one class, of every tenant
// (Tenant "") or of one tenant with dedicated boxes.
type Key[C Class] struct {
	Tenant string
	Class  C
}

// Source is the box source: neutral boxes per class, and the idle boxes of
// each tenant.
type Source[B Box, C Class, I any] struct {
	maker Maker[B, C, I]
	cfg   Config
	log   *slog.Logger
	// after is the timer await retries a failed creation on (time.After;
	// tests use a manual clock's).
	after func(time.Duration) <-chan time.Time

	mu       sync.Mutex
	idle     map[Key[C]][]B
	neutral  map[C][]B
	creating map[C]int
	live     int // boxes created or being created, idle or busy
	stopped  bool
	// failedAt is when making a box of a class last failed: none of that
	// class is tried again for RetryAfter (a broken image or runtime
	// must not spin; another runtime's boxes are still made).
	failedAt map[C]time.Time
	// changed is closed (and replaced) whenever a box becomes idle or
	// neutral: what await waits on.
	changed chan struct{}
	// making counts the creations under way, from the decision to make a
	// box until the box is kept or ended; settled is closed (and replaced)
	// when it falls to zero: what settle waits on.
	making  int
	settled chan struct{}
	// Figures (Stats).
	hits, claims, misses, retired, prepared, discarded int64
}

// NewSource is a source making and ending its boxes through maker.
func NewSource[B Box, C Class, I any](maker Maker[B, C, I], cfg Config, log *slog.Logger) *Source[B, C, I] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Source[B, C, I]{maker: maker, cfg: cfg, log: log, after: time.After,
		idle: map[Key[C]][]B{}, neutral: map[C][]B{}, creating: map[C]int{}, failedAt: map[C]time.Time{}}
}

// Prepared counts a job that found its inner sandbox made ahead of it.
func (bx *Source[B, C, I]) Prepared() {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	bx.prepared++
}

// Discarded counts an inner sandbox made ahead and discarded (the job
// that came had other limits or a network).
func (bx *Source[B, C, I]) Discarded() {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	bx.discarded++
}

// signal wakes the awaiters of a box; bx.mu is held.
func (bx *Source[B, C, I]) signal() {
	if bx.changed != nil {
		close(bx.changed)
		bx.changed = nil
	}
}

// Take returns an idle box of key, else a neutral box of its class (which
// becomes key's), else nil. A box of a tenant with dedicated boxes never
// serves another tenant.
func (bx *Source[B, C, I]) Take(ctx context.Context, key Key[C], img I) B {
	var zero B
	var dead []B
	defer func() {
		for _, sb := range dead {
			bx.Retire(ctx, sb)
		}
	}()
	bx.mu.Lock()
	defer bx.mu.Unlock()
	now := bx.cfg.Now()
	usable := func(sb B) bool {
		if sb.ExitedIdle() || now.Sub(sb.Prepared()) > bx.cfg.MaxAge {
			dead = append(dead, sb)
			return false
		}
		return true
	}
	for q := bx.idle[key]; len(q) > 0; q = bx.idle[key] {
		sb := q[len(q)-1] // the most recently used: its pages are warm
		bx.idle[key] = q[:len(q)-1]
		if usable(sb) {
			bx.hits++
			return sb
		}
	}
	for q := bx.neutral[key.Class]; len(q) > 0; q = bx.neutral[key.Class] {
		sb := q[0]
		bx.neutral[key.Class] = q[1:]
		if usable(sb) {
			sb.Claim(key.Tenant)
			bx.claims++
			// The class's next neutral box: decided now, made in the
			// background (retiring a victim first may take a while).
			if victim, ok := bx.reserve(key.Class, false); ok {
				go bx.create(context.WithoutCancel(ctx), key.Class, img, victim)
			}
			return sb
		}
	}
	bx.misses++
	return zero
}

// Await waits (at most a minute) for a box of key when boxes are to be
// waited for (Config.Wait); nil otherwise.
func (bx *Source[B, C, I]) Await(ctx context.Context, key Key[C], img I) B {
	var zero B
	if !bx.cfg.Wait {
		return zero
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		bx.mu.Lock()
		if bx.changed == nil {
			bx.changed = make(chan struct{})
		}
		changed := bx.changed
		ready := len(bx.idle[key]) + len(bx.neutral[key.Class])
		bx.mu.Unlock()
		if ready > 0 {
			if sb := bx.Take(ctx, key, img); sb != zero {
				return sb
			}
		}
		// Only then: at the bound, grow retires an idle box, and that must
		// not be the one this job was woken for.
		bx.Demand(ctx, key.Class, img)
		// A failed creation is tried again after RetryAfter.
		select {
		case <-changed:
		case <-bx.after(RetryAfter):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			return zero
		}
	}
}

// Put returns a box that served a job cleanly to its tenant's idle set; false
// once the source is stopped (the box is then the caller's to retire).
func (bx *Source[B, C, I]) Put(key Key[C], sb B) bool {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.stopped {
		return false
	}
	bx.idle[key] = append(bx.idle[key], sb)
	bx.signal()
	return true
}

// Retire ends a box (nil: one whose creation failed before it existed) and
// frees its place.
func (bx *Source[B, C, I]) Retire(ctx context.Context, sb B) {
	bx.mu.Lock()
	bx.live--
	bx.retired++
	bx.mu.Unlock()
	var zero B
	if sb != zero {
		bx.maker.EndBox(ctx, sb)
	}
}

// Grow makes a neutral box of class cls in the background unless the class
// already has its neutral boxes (ready or being made). At the bound, the
// least recently used idle box of any tenant is retired to make room.
func (bx *Source[B, C, I]) Grow(ctx context.Context, cls C, img I) {
	bx.grow(ctx, cls, img, false)
}

// Demand is Grow for a job that found no box of its class: at the bound
// with no idle box, a neutral box of another class (the oldest) is retired
// to make room, since a job wants this class and none wants that box yet.
func (bx *Source[B, C, I]) Demand(ctx context.Context, cls C, img I) {
	bx.grow(ctx, cls, img, true)
}

func (bx *Source[B, C, I]) grow(ctx context.Context, cls C, img I, demand bool) {
	bx.mu.Lock()
	victim, ok := bx.reserve(cls, demand)
	bx.mu.Unlock()
	if ok {
		bx.create(ctx, cls, img, victim)
	}
}

// reserve is grow's decision, under bx.mu: whether a box of cls is to be
// made, and the box to retire first to make room (nil: none): the least
// recently used idle box, else, for a demand, the oldest neutral box of
// another class. A reservation counts as live and as being made until
// create is done with it.
func (bx *Source[B, C, I]) reserve(cls C, demand bool) (victim B, ok bool) {
	var zero B
	if bx.stopped || len(bx.neutral[cls])+bx.creating[cls] >= max(bx.cfg.Neutral, 1) || bx.cfg.Now().Sub(bx.failedAt[cls]) < RetryAfter {
		return zero, false
	}
	if bx.live >= bx.cfg.Max {
		var vk Key[C]
		for k, q := range bx.idle {
			if len(q) > 0 && (victim == zero || q[0].LastUsed().Before(victim.LastUsed())) {
				victim, vk = q[0], k
			}
		}
		if victim != zero {
			bx.idle[vk] = bx.idle[vk][1:]
		} else if demand {
			var vc C
			for c, q := range bx.neutral {
				if c != cls && len(q) > 0 && (victim == zero || q[0].Prepared().Before(victim.Prepared())) {
					victim, vc = q[0], c
				}
			}
			if victim == zero {
				return zero, false // every box is busy, or of this class
			}
			bx.neutral[vc] = bx.neutral[vc][1:]
		} else {
			return zero, false // every box is busy, or not idle yet
		}
	}
	bx.creating[cls]++
	bx.live++
	bx.making++
	return victim, true
}

// create carries out a reservation: it retires the victim, if any, then makes
// the box in the background.
func (bx *Source[B, C, I]) create(ctx context.Context, cls C, img I, victim B) {
	var zero B
	if victim != zero {
		bx.Retire(ctx, victim)
	}
	go func() {
		defer bx.made()
		// Its spans stand alone: no job waits for it.
		ctx := trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
		sb, err := bx.maker.MakeBox(ctx, cls, img)
		bx.mu.Lock()
		bx.creating[cls]--
		ok := err == nil && !bx.stopped
		if err != nil {
			bx.failedAt[cls] = bx.cfg.Now()
		}
		if ok {
			bx.neutral[cls] = append(bx.neutral[cls], sb)
		}
		bx.signal()
		bx.mu.Unlock()
		if !ok {
			if err != nil {
				bx.log.WarnContext(ctx, "box", slog.String("runtime", cls.Runtime()), slog.Any("error", err))
			}
			bx.Retire(ctx, sb)
		}
	}()
}

// made ends a creation's count (reserve).
func (bx *Source[B, C, I]) made() {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.making--; bx.making == 0 && bx.settled != nil {
		close(bx.settled)
		bx.settled = nil
	}
}

// Settle waits until no box is being made (each one made is then kept or
// ended), or ctx ends.
func (bx *Source[B, C, I]) Settle(ctx context.Context) error {
	bx.mu.Lock()
	if bx.making == 0 {
		bx.mu.Unlock()
		return nil
	}
	if bx.settled == nil {
		bx.settled = make(chan struct{})
	}
	settled := bx.settled
	bx.mu.Unlock()
	select {
	case <-settled:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Stop retires every idle and neutral box; from then on no box is made or
// kept (Close). A box being made is ended once made (settle waits for it).
func (bx *Source[B, C, I]) Stop(ctx context.Context) {
	bx.mu.Lock()
	bx.stopped = true
	var all []B
	for k, q := range bx.idle {
		all = append(all, q...)
		delete(bx.idle, k)
	}
	for k, q := range bx.neutral {
		all = append(all, q...)
		delete(bx.neutral, k)
	}
	bx.mu.Unlock()
	for _, sb := range all {
		bx.Retire(ctx, sb)
	}
}

// Idle lists the idle boxes (those that served a job).
func (bx *Source[B, C, I]) Idle() []B {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	var out []B
	for _, q := range bx.idle {
		out = append(out, q...)
	}
	return out
}

// Waiting lists the idle and neutral boxes.
func (bx *Source[B, C, I]) Waiting() []B {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	var out []B
	for _, q := range bx.idle {
		out = append(out, q...)
	}
	for _, q := range bx.neutral {
		out = append(out, q...)
	}
	return out
}

// stats returns the figures.
func (bx *Source[B, C, I]) Stats() Stats {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	s := Stats{Live: bx.live, Hits: bx.hits, Claims: bx.claims, Misses: bx.misses, Retired: bx.retired,
		Prepared: bx.prepared, Discarded: bx.discarded}
	for _, q := range bx.idle {
		s.Idle += len(q)
	}
	for _, q := range bx.neutral {
		s.Neutral += len(q)
	}
	return s
}
