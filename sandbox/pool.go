package sandbox

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	ktrace "github.com/kilnrun/kiln/trace"
)

type classState struct {
	idle     []*sandbox
	target   int
	lastMiss time.Time
	def      bool  // a runtime's default class: never below Min
	memEach  int64 // the last measured memory of one idle sandbox
}

// pool holds a Containerd's idle sandboxes.
type pool struct {
	b    poolBackend
	cfg  PoolConfig
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex
	classes map[poolClass]*classState
	stats   map[string]*PoolStats // by runtime: the counters
	stopped bool
}

func newPool(b poolBackend, cfg PoolConfig, log *slog.Logger) *pool {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &pool{b: b, cfg: cfg.withDefaults(), log: log, wake: make(chan struct{}, 1),
		classes: map[poolClass]*classState{}, stats: map[string]*PoolStats{}}
}

// retire removes sandboxes that left the pool for good.
func (p *pool) retire(ctx context.Context, stale []*sandbox) {
	for _, sb := range stale {
		p.b.retire(ctx, sb)
		if h := p.cfg.Hooks.Retired; h != nil {
			h(PoolEvent{Runtime: sb.class.runtime, ID: sb.id})
		}
	}
}

func (p *pool) enabled() bool { return p != nil && p.cfg.Max > 0 }

func (p *pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pool) stat(runtime string) *PoolStats {
	s := p.stats[runtime]
	if s == nil {
		s = &PoolStats{Runtime: runtime}
		p.stats[runtime] = s
	}
	return s
}

// take returns an idle sandbox of img's class, or nil (a miss, which raises
// the class's target).
func (p *pool) take(ctx context.Context, runtime string, img *imageEntry, cls poolClass) *sandbox {
	if !p.enabled() || img.isolation != IsolationRunc {
		return nil
	}
	var stale []*sandbox
	defer func() { p.retire(ctx, stale) }()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	st := p.classes[cls]
	for st != nil && len(st.idle) > 0 {
		// Oldest first: it has had the longest to finish preloading.
		sb := st.idle[0]
		st.idle = st.idle[1:]
		if sb.img.digest != img.digest || exitedIdle(sb) {
			stale = append(stale, sb)
			continue
		}
		p.stat(runtime).Hits++
		p.signal()
		return sb
	}
	p.stat(runtime).Misses++
	if st == nil {
		if len(p.classes) >= poolMaxClasses {
			return nil
		}
		st = &classState{}
		p.classes[cls] = st
	}
	st.target = min(st.target+1, p.cfg.Max)
	st.lastMiss = p.cfg.Now()
	p.signal()
	return nil
}

// unfit counts a pooled sandbox that could not serve its job's limits.
func (p *pool) unfit(runtime string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stat(runtime).Unfit++
}

// exitedIdle reports whether an idle sandbox's task has ended (its init's
// idle limit, a crash, or containerd lost the exit stream across a restart).
func exitedIdle(sb *sandbox) bool {
	select {
	case <-sb.exitCh:
		sb.exited = true
		return true
	default:
		return false
	}
}

// seed registers each runtime's default class with Min as its target.
func (p *pool) seed(ctx context.Context) {
	for _, rt := range p.b.Runtimes() {
		img, err := p.b.resolve(ctx, rt)
		if err != nil {
			p.log.WarnContext(ctx, "sandbox pool: runtime not pooled yet", slog.String("runtime", rt), slog.Any("error", err))
			continue
		}
		if img.isolation != IsolationRunc {
			continue
		}
		cls, boxed, err := p.b.defaultClass(rt, img)
		if err != nil {
			continue
		}
		if boxed {
			// Its jobs run in boxes; a miss runs cold and, with demand,
			// the pool grows for it like for any class.
			continue
		}
		p.mu.Lock()
		if p.classes[cls] == nil {
			p.classes[cls] = &classState{target: p.cfg.Min, def: true}
		}
		p.mu.Unlock()
	}
}

// run keeps the pool filled until ctx ends.
func (p *pool) run(ctx context.Context) {
	p.seed(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seeded := time.Now()
	p.maintain(ctx)
	for {
		for ctx.Err() == nil && p.refillOne(ctx) {
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake: // a take or a miss: refill only
		case <-tick.C:
			// Image look-ups and cgroup reads once a second, not per job.
			if time.Since(seeded) > 10*time.Second {
				p.seed(ctx) // a runtime whose image was missing at start
				seeded = time.Now()
			}
			p.maintain(ctx)
		}
	}
}

// maintain retires idle sandboxes that ended, outlived MaxIdle, or belong to
// a replaced image, lowers targets without recent misses, and measures what
// the idle ones hold.
func (p *pool) maintain(ctx context.Context) {
	current := map[string]*imageEntry{}
	for _, rt := range p.b.Runtimes() {
		if img, err := p.b.resolve(ctx, rt); err == nil {
			current[rt] = img
		}
	}
	p.retire(ctx, p.expire(current))
	p.measure()
}

// expire is maintain's decision: it takes out of the pool, and returns,
// the idle sandboxes that ended, outlived MaxIdle, are not of their
// runtime's current image, or are above their class's target, and lowers
// the targets of classes without a miss for a minute. current is each
// runtime's image now (a runtime missing from it keeps its sandboxes).
func (p *pool) expire(current map[string]*imageEntry) []*sandbox {
	now := p.cfg.Now()
	var stale []*sandbox
	p.mu.Lock()
	defer p.mu.Unlock()
	for cls, st := range p.classes {
		keep := st.idle[:0]
		for _, sb := range st.idle {
			img := current[cls.runtime]
			if exitedIdle(sb) || now.Sub(sb.prepared) > p.cfg.MaxIdle || (img != nil && img.digest != sb.img.digest) {
				stale = append(stale, sb)
				continue
			}
			keep = append(keep, sb)
		}
		st.idle = keep
		floor := 0
		if st.def {
			floor = p.cfg.Min
		}
		if st.target > floor && now.Sub(st.lastMiss) > time.Minute {
			st.target--
			st.lastMiss = now
		}
		for len(st.idle) > max(st.target, floor) {
			stale = append(stale, st.idle[len(st.idle)-1])
			st.idle = st.idle[:len(st.idle)-1]
		}
		if st.target == 0 && len(st.idle) == 0 && !st.def {
			delete(p.classes, cls)
		}
	}
	return stale
}

// measure records what one idle sandbox of each class holds.
func (p *pool) measure() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.classes {
		for _, sb := range st.idle {
			if m, err := p.b.idleMemory(sb); err == nil && m > 0 {
				st.memEach = max(st.memEach, m)
			}
		}
	}
}

// idleMemory is what the idle sandboxes hold, estimated per class.
func (p *pool) idleMemory() int64 {
	var n int64
	for _, st := range p.classes {
		n += int64(len(st.idle)) * st.memEach
	}
	return n
}

// refillOne prepares one sandbox for the class furthest below its target,
// and reports whether it did (so the caller tries the next).
func (p *pool) refillOne(ctx context.Context) bool {
	if p.cfg.Busy != nil && p.cfg.Busy() {
		return false
	}
	cls, ok := p.due()
	if !ok {
		return false
	}

	img, err := p.b.resolve(ctx, cls.runtime)
	if err != nil {
		p.log.WarnContext(ctx, "sandbox pool: resolve image", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	lim, err := p.b.creationLimits(img, cls)
	if err != nil {
		p.log.WarnContext(ctx, "sandbox pool: limits", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	start := p.cfg.Now()
	preload := img.profile.Preload
	if mods, ok := p.cfg.Preload[cls.runtime]; ok {
		preload = mods
	}
	if len(preload) > 0 {
		// Room for the preloading on top of a job's limits; the job's arm
		// sets the limits to what the preload holds or used plus the
		// job's. RLIMIT_CPU's hard limit can only be lowered from outside
		// (raising it needs CAP_SYS_RESOURCE, which a host may not give
		// root): it is made with the preload's CPU time as room.
		lim.MemoryMB += preloadAllowanceMB
		lim.CPUMS += preloadAllowanceCPUMS
	}
	sb, err := p.b.prepareIdle(ctx, img, cls, lim, preload)
	if sb != nil {
		sb.prepared = start // on the clock expire judges MaxIdle by
	}
	if err != nil {
		p.b.retire(ctx, sb)
		p.log.WarnContext(ctx, "sandbox pool: prepare", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	p.mu.Lock()
	if p.stopped || p.classes[cls] == nil {
		p.mu.Unlock()
		p.b.retire(ctx, sb)
		return false
	}
	st := p.classes[cls]
	st.idle = append(st.idle, sb)
	s := p.stat(cls.runtime)
	s.Refills++
	s.RefillTime += p.cfg.Now().Sub(start)
	p.mu.Unlock()
	if h := p.cfg.Hooks.Refilled; h != nil {
		h(PoolEvent{Runtime: cls.runtime, ID: sb.id})
	}
	return true
}

// due is refillOne's decision: the class furthest below its target, if
// one is below it and a sandbox more of it fits the memory budget.
func (p *pool) due() (poolClass, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cls poolClass
	var st *classState
	worst := 0
	for c, s := range p.classes {
		if d := s.target - len(s.idle); d > worst {
			cls, st, worst = c, s, d
		}
	}
	if st == nil || p.stopped || p.idleMemory()+st.memEach > p.cfg.MemoryBudget {
		return poolClass{}, false
	}
	return cls, true
}

func (p *pool) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(poolRetry):
	}
}

// drain empties the pool for good and returns what it held.
func (p *pool) drain() []*sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	var out []*sandbox
	for _, st := range p.classes {
		out = append(out, st.idle...)
		st.idle = nil
	}
	return out
}

// Stats returns each runtime's pool figures, sorted by runtime.
func (p *pool) Stats() []PoolStats {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	agg := map[string]PoolStats{}
	for rt, s := range p.stats {
		agg[rt] = *s
	}
	for cls, st := range p.classes {
		s := agg[cls.runtime]
		s.Runtime = cls.runtime
		s.Idle += len(st.idle)
		s.Target += st.target
		s.MemoryBytes += int64(len(st.idle)) * st.memEach
		agg[cls.runtime] = s
	}
	out := make([]PoolStats, 0, len(agg))
	for _, s := range agg {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b PoolStats) int { return strings.Compare(a.Runtime, b.Runtime) })
	return out
}

// markPooled records on the job's span whether its sandbox came from the pool.
func markPooled(ctx context.Context, pooled bool) {
	trace.SpanFromContext(ctx).SetAttributes(ktrace.SandboxPooledKey.Bool(pooled))
}

// preloadedMarker is what a launcher writes to stdout once it has imported
// the modules KILN_PRELOAD names (deploy/images/python/launch.py).
var preloadedMarker = []byte("\x00kiln-preloaded\n")
