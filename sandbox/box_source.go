package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The box source: which box a job gets, when a box is made and when one is
// retired. It holds the neutral boxes of each class and every tenant's idle
// boxes, keeps each class's neutral boxes ready (BoxConfig.Neutral), bounds
// the boxes (BoxConfig.Max) by retiring the least recently used idle box of
// any tenant, retires a box too old (BoxConfig.MaxAge) or ended when a job
// would take it, and backs off after a failed creation (boxRetryAfter). It
// makes and ends boxes through a boxMaker (the containerd backend, box.go)
// and judges time by BoxConfig.Now, so its decisions are tested with a fake
// maker on a manual clock (box_source_test.go).

// boxMaker makes and ends the boxes of a box source.
type boxMaker interface {
	// makeBox makes a box of class cls for img and returns it once its
	// supervisor is ready for jobs (its prepared time set). On error the
	// box it returns, if any, is still to be ended.
	makeBox(ctx context.Context, cls poolClass, img *imageEntry) (*sandbox, error)
	// endBox stops and removes a box (never nil) the source let go.
	endBox(ctx context.Context, sb *sandbox)
}

// boxRetryAfter is how long after a failed box no new one is tried.
const boxRetryAfter = 2 * time.Second

// boxKey is what a box serves: the jobs of one limits class, of every
// tenant (tenant "") or of one tenant with dedicated boxes.
type boxKey struct {
	tenant string
	class  poolClass
}

// boxes is the box source: neutral boxes per class, and the idle boxes of
// each tenant.
type boxes struct {
	maker boxMaker
	cfg   BoxConfig
	log   *slog.Logger
	// after is the timer await retries a failed creation on (time.After;
	// tests use a manual clock's).
	after func(time.Duration) <-chan time.Time

	mu       sync.Mutex
	idle     map[boxKey][]*sandbox
	neutral  map[poolClass][]*sandbox
	creating map[poolClass]int
	live     int // boxes created or being created, idle or busy
	stopped  bool
	// failedAt is when making a box of a class last failed: none of that
	// class is tried again for boxRetryAfter (a broken image or runtime
	// must not spin; another runtime's boxes are still made).
	failedAt map[poolClass]time.Time
	// changed is closed (and replaced) whenever a box becomes idle or
	// neutral: what await waits on.
	changed chan struct{}
	// making counts the creations under way, from the decision to make a
	// box until the box is kept or ended; settled is closed (and replaced)
	// when it falls to zero: what settle waits on.
	making  int
	settled chan struct{}
	// Figures (BoxStats).
	hits, claims, misses, retired, prepared, discarded int64
}

func newBoxes(maker boxMaker, cfg BoxConfig, log *slog.Logger) *boxes {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &boxes{maker: maker, cfg: cfg.withDefaults(), log: log, after: time.After,
		idle: map[boxKey][]*sandbox{}, neutral: map[poolClass][]*sandbox{}, creating: map[poolClass]int{}, failedAt: map[poolClass]time.Time{}}
}

// count updates the figures under bx.mu.
func (bx *boxes) count(f func(*boxes)) {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	f(bx)
}

// signal wakes the awaiters of a box; bx.mu is held.
func (bx *boxes) signal() {
	if bx.changed != nil {
		close(bx.changed)
		bx.changed = nil
	}
}

// take returns an idle box of key, else a neutral box of its class (which
// becomes key's), else nil. A box of a tenant with dedicated boxes never
// serves another tenant.
func (bx *boxes) take(ctx context.Context, key boxKey, img *imageEntry) *sandbox {
	var dead []*sandbox
	defer func() {
		for _, sb := range dead {
			bx.retire(ctx, sb)
		}
	}()
	bx.mu.Lock()
	defer bx.mu.Unlock()
	now := bx.cfg.Now()
	usable := func(sb *sandbox) bool {
		if exitedIdle(sb) || now.Sub(sb.prepared) > bx.cfg.MaxAge {
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
	for q := bx.neutral[key.class]; len(q) > 0; q = bx.neutral[key.class] {
		sb := q[0]
		bx.neutral[key.class] = q[1:]
		if usable(sb) {
			sb.box.tenant = key.tenant
			bx.claims++
			// The class's next neutral box: decided now, made in the
			// background (retiring a victim first may take a while).
			if victim, ok := bx.reserve(key.class); ok {
				go bx.create(context.WithoutCancel(ctx), key.class, img, victim)
			}
			return sb
		}
	}
	bx.misses++
	return nil
}

// await waits (at most a minute) for a box of key when boxes are to be
// waited for (BoxConfig.wait); nil otherwise.
func (bx *boxes) await(ctx context.Context, key boxKey, img *imageEntry) *sandbox {
	if !bx.cfg.wait {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		bx.mu.Lock()
		if bx.changed == nil {
			bx.changed = make(chan struct{})
		}
		changed := bx.changed
		ready := len(bx.idle[key]) + len(bx.neutral[key.class])
		bx.mu.Unlock()
		if ready > 0 {
			if sb := bx.take(ctx, key, img); sb != nil {
				return sb
			}
		}
		// Only then: at the bound, grow retires an idle box, and that must
		// not be the one this job was woken for.
		bx.grow(ctx, key.class, img)
		// A failed creation is tried again after boxRetryAfter.
		select {
		case <-changed:
		case <-bx.after(boxRetryAfter):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// put returns a box that served a job cleanly to its tenant's idle set; false
// once the source is stopped (the box is then the caller's to retire).
func (bx *boxes) put(key boxKey, sb *sandbox) bool {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.stopped {
		return false
	}
	bx.idle[key] = append(bx.idle[key], sb)
	bx.signal()
	return true
}

// retire ends a box (nil: one whose creation failed before it existed) and
// frees its place.
func (bx *boxes) retire(ctx context.Context, sb *sandbox) {
	bx.mu.Lock()
	bx.live--
	bx.retired++
	bx.mu.Unlock()
	if sb != nil {
		bx.maker.endBox(ctx, sb)
	}
}

// grow makes a neutral box of class cls in the background unless the class
// already has its neutral boxes (ready or being made). At the bound, the
// least recently used idle box of any tenant is retired to make room.
func (bx *boxes) grow(ctx context.Context, cls poolClass, img *imageEntry) {
	bx.mu.Lock()
	victim, ok := bx.reserve(cls)
	bx.mu.Unlock()
	if ok {
		bx.create(ctx, cls, img, victim)
	}
}

// reserve is grow's decision, under bx.mu: whether a box of cls is to be
// made, and the idle box to retire first to make room (nil: none). A
// reservation counts as live and as being made until create is done with it.
func (bx *boxes) reserve(cls poolClass) (victim *sandbox, ok bool) {
	if bx.stopped || len(bx.neutral[cls])+bx.creating[cls] >= max(bx.cfg.Neutral, 1) || bx.cfg.Now().Sub(bx.failedAt[cls]) < boxRetryAfter {
		return nil, false
	}
	if bx.live >= bx.cfg.Max {
		var vk boxKey
		for k, q := range bx.idle {
			if len(q) > 0 && (victim == nil || q[0].box.lastUsed.Before(victim.box.lastUsed)) {
				victim, vk = q[0], k
			}
		}
		if victim == nil {
			return nil, false // every box is busy
		}
		bx.idle[vk] = bx.idle[vk][1:]
	}
	bx.creating[cls]++
	bx.live++
	bx.making++
	return victim, true
}

// create carries out a reservation: it retires the victim, if any, then makes
// the box in the background.
func (bx *boxes) create(ctx context.Context, cls poolClass, img *imageEntry, victim *sandbox) {
	if victim != nil {
		bx.retire(ctx, victim)
	}
	go func() {
		defer bx.made()
		// Its spans stand alone: no job waits for it.
		ctx := trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
		sb, err := bx.maker.makeBox(ctx, cls, img)
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
				bx.log.WarnContext(ctx, "box", slog.String("runtime", cls.runtime), slog.Any("error", err))
			}
			bx.retire(ctx, sb)
		}
	}()
}

// made ends a creation's count (reserve).
func (bx *boxes) made() {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.making--; bx.making == 0 && bx.settled != nil {
		close(bx.settled)
		bx.settled = nil
	}
}

// settle waits until no box is being made (each one made is then kept or
// ended), or ctx ends.
func (bx *boxes) settle(ctx context.Context) error {
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

// stop retires every idle and neutral box; from then on no box is made or
// kept (Close). A box being made is ended once made (settle waits for it).
func (bx *boxes) stop(ctx context.Context) {
	bx.mu.Lock()
	bx.stopped = true
	var all []*sandbox
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
		bx.retire(ctx, sb)
	}
}

// waiting lists the idle and neutral boxes.
func (bx *boxes) waiting() []*sandbox {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	var out []*sandbox
	for _, q := range bx.idle {
		out = append(out, q...)
	}
	for _, q := range bx.neutral {
		out = append(out, q...)
	}
	return out
}

// stats returns the figures.
func (bx *boxes) stats() BoxStats {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	s := BoxStats{Live: bx.live, Hits: bx.hits, Claims: bx.claims, Misses: bx.misses, Retired: bx.retired,
		Prepared: bx.prepared, Discarded: bx.discarded}
	for _, q := range bx.idle {
		s.Idle += len(q)
	}
	for _, q := range bx.neutral {
		s.Neutral += len(q)
	}
	return s
}
