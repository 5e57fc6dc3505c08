package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Defaults of PoolConfig.
const (
	PoolMemoryBudgetDefault = 1 << 30
	PoolMaxIdleDefault      = 4 * time.Minute // under kiln-init's own idle limit (initIdleLimit)
	// poolMaxClasses bounds how many limits classes one pool keeps
	// sandboxes for: a class is only worth keeping warm while jobs use it.
	poolMaxClasses = 8
	// poolRetry is how long the refill waits after a failed prepare.
	poolRetry = 2 * time.Second
)

// LabelPool marks a pooled sandbox (its value is the runtime); the job id
// label is added when its job arrives.
const LabelPool = "kiln.pool"

// poolIDPrefix starts a pooled sandbox's container id: no job exists when it
// is named.
const poolIDPrefix = "kiln-pool-"

// PoolConfig configures the warm pool: sandboxes created and started ahead
// of demand (their launchers waiting on stdin, the runtime's preload modules
// imported), each of which still serves exactly one job. The zero value
// keeps no pool.
type PoolConfig struct {
	// Max is the most idle sandboxes kept per runtime and limits class.
	// Default: 0, no pool.
	Max int
	// Min is how many idle sandboxes of each runtime's default limits class
	// are kept whatever the demand. The size follows demand between Min and
	// Max: a job that found the pool empty raises it by one, and a minute
	// without such a miss lowers it by one. Default: 0.
	Min int
	// MemoryBudget bounds the memory all idle sandboxes together hold, as
	// their cgroups count it, in bytes. Default: PoolMemoryBudgetDefault (1 GiB).
	MemoryBudget int64
	// MaxIdle is how long a sandbox may wait for a job before it is
	// replaced. Default: PoolMaxIdleDefault (4 minutes).
	MaxIdle time.Duration
	// Preload overrides, per runtime, the modules its profile preloads
	// (RuntimeProfile.Preload); a runtime listed with no modules preloads
	// none. Default: nil, every runtime preloads what its profile says.
	Preload map[string][]string
	// Busy reports whether every slot of the worker is running a job. The
	// pool does not refill while it is: preparing a sandbox costs as much
	// CPU as a cold job, and the jobs already running come first. Default:
	// nil, never busy.
	Busy func() bool
	// Now is the clock the pool judges by: how long a sandbox has waited
	// (MaxIdle, against the time it was prepared) and how long a class has
	// gone without a miss. Default: time.Now.
	Now func() time.Time
	// Hooks signal what the pool does, for tests to wait on. Default: none.
	Hooks PoolHooks
}

// PoolHooks are signals of the pool's work. Each is called synchronously
// where the event happens, so it must return quickly; a nil hook is
// skipped.
type PoolHooks struct {
	// Refilled: a sandbox was prepared and waits in the pool.
	Refilled func(PoolEvent)
	// Retired: an idle sandbox left the pool for good (it ended, outlived
	// MaxIdle, is of a replaced image, or is above its class's target).
	Retired func(PoolEvent)
}

// PoolEvent names the sandbox a PoolHooks function is told of.
type PoolEvent struct {
	Runtime string
	ID      string // the sandbox's container id
}

func (c PoolConfig) withDefaults() PoolConfig {
	c.MemoryBudget = cmp.Or(c.MemoryBudget, PoolMemoryBudgetDefault)
	c.MaxIdle = cmp.Or(c.MaxIdle, PoolMaxIdleDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration the pool cannot run with.
func (c PoolConfig) Validate() error {
	var errs []error
	if c.Max < 0 || c.Min < 0 || c.Min > c.Max {
		errs = append(errs, fmt.Errorf("sandbox: pool Min %d and Max %d must satisfy 0 <= Min <= Max", c.Min, c.Max))
	}
	if c.MemoryBudget < 0 {
		errs = append(errs, fmt.Errorf("sandbox: pool MemoryBudget %d must not be negative", c.MemoryBudget))
	}
	if c.MaxIdle < 0 || c.MaxIdle > initIdleLimit {
		errs = append(errs, fmt.Errorf("sandbox: pool MaxIdle %s must be between 0 and %s (kiln-init ends a sandbox that waited that long)", c.MaxIdle, initIdleLimit))
	}
	return errors.Join(errs...)
}

// poolClass is what a sandbox must be created with and a job's limits
// cannot change afterwards: the runtime (its image), the size of the
// tmpfs mounts, and for a runtime whose launcher flags depend on the memory
// limit (node's heap), that limit. The rest (memory, pids, CPU, timeout,
// output) is armed when the job arrives.
type poolClass struct {
	runtime string
	diskMB  int64
	heapMB  int64
}

func classOf(runtime string, img *imageEntry, lim job.Limits) poolClass {
	c := poolClass{runtime: runtime, diskMB: lim.DiskMB}
	if img.profile.heapFlagged() {
		c.heapMB = lim.MemoryMB
	}
	return c
}

// creationLimits are the limits a sandbox of class cls is created with
// ahead of its job: the runtime's defaults, so a job with the default limits
// (most jobs) needs no cgroup or rlimit write when it arrives, but the
// policy's longest timeout for kiln-init's own backstop (the worker's clock
// times the job), a second of CPU more for the preloading, and the class's
// disk and heap.
func (r *Containerd) creationLimits(img *imageEntry, cls poolClass) (job.Limits, error) {
	lim, err := r.cfg.Policy.Resolve(img.profile.Limits)
	if err != nil {
		return job.Limits{}, err
	}
	lim.DiskMB = cls.diskMB
	if cls.heapMB > 0 {
		lim.MemoryMB = cls.heapMB
	}
	lim.TimeoutMS = r.cfg.Policy.Max.TimeoutMS
	lim.CPUMS += preloadCPUAllowance.Milliseconds()
	lim.OutputBytes = r.cfg.Policy.Max.OutputBytes
	return lim, nil
}

// preloadCPUAllowance is CPU time a pooled sandbox is created with beyond
// the default limit, for its launcher's preloading: a default job's limit,
// counted on top of what the preloading used, then needs no change.
const preloadCPUAllowance = time.Second

// PoolStats are a runtime's pool figures, for metrics.
type PoolStats struct {
	Runtime string
	Idle    int // sandboxes waiting for a job
	Target  int // idle sandboxes the pool is filling towards
	Hits    int64
	Misses  int64
	// Unfit counts pooled sandboxes that could not take their job's limits
	// (the launcher already held more memory than the job may use): the
	// job ran cold.
	Unfit int64
	// Refills counts sandboxes prepared for the pool; RefillTime is the
	// time they took in all.
	Refills    int64
	RefillTime time.Duration
	// MemoryBytes is what the idle sandboxes hold, by their cgroups.
	MemoryBytes int64
}

type classState struct {
	idle     []*sandbox
	target   int
	lastMiss time.Time
	def      bool  // a runtime's default class: never below Min
	memEach  int64 // the last measured memory of one idle sandbox
}

// pool holds a Containerd's idle sandboxes.
type pool struct {
	r    *Containerd
	cfg  PoolConfig
	wake chan struct{}
	// remove ends a sandbox that leaves the pool (r.retire).
	remove func(context.Context, *sandbox)

	mu      sync.Mutex
	classes map[poolClass]*classState
	stats   map[string]*PoolStats // by runtime: the counters
	stopped bool
}

func newPool(r *Containerd, cfg PoolConfig) *pool {
	p := &pool{r: r, cfg: cfg.withDefaults(), wake: make(chan struct{}, 1),
		classes: map[poolClass]*classState{}, stats: map[string]*PoolStats{}}
	if r != nil {
		p.remove = r.retire
	}
	return p
}

// retire removes sandboxes that left the pool for good.
func (p *pool) retire(ctx context.Context, stale []*sandbox) {
	for _, sb := range stale {
		p.remove(ctx, sb)
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
	for _, rt := range p.r.Runtimes() {
		img, err := p.r.resolve(ctx, rt)
		if err != nil {
			p.r.log.WarnContext(ctx, "sandbox pool: runtime not pooled yet", slog.String("runtime", rt), slog.Any("error", err))
			continue
		}
		if img.isolation != IsolationRunc {
			continue
		}
		lim, err := p.r.cfg.Policy.Resolve(img.profile.Limits)
		if err != nil {
			continue
		}
		if _, boxed := p.r.boxable(rt, img, lim, ""); boxed {
			// Its jobs run in boxes; a miss runs cold and, with demand,
			// the pool grows for it like for any class.
			continue
		}
		cls := classOf(rt, img, lim)
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
	for _, rt := range p.r.Runtimes() {
		if img, err := p.r.resolve(ctx, rt); err == nil {
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
			if cg, err := newCgroupDir(cgroupRoot, cgroupV2(), sb.cgroupsPath); err == nil {
				if m, err := cg.memoryUsage(); err == nil && m > 0 {
					st.memEach = max(st.memEach, m)
				}
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

	img, err := p.r.resolve(ctx, cls.runtime)
	if err != nil {
		p.r.log.WarnContext(ctx, "sandbox pool: resolve image", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	lim, err := p.r.creationLimits(img, cls)
	if err != nil {
		p.r.log.WarnContext(ctx, "sandbox pool: limits", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	start := time.Now()
	preload := img.profile.Preload
	if mods, ok := p.cfg.Preload[cls.runtime]; ok {
		preload = mods
	}
	sb, err := p.r.prepare(ctx, img, prepOpts{lim: lim, preload: preload, class: cls})
	if err == nil {
		// Started is not yet running: a job armed before kiln-init has
		// forked the launcher would find no process to set limits on.
		err = awaitLauncher(ctx, sb, len(preload) > 0)
	}
	if err != nil {
		p.r.retire(ctx, sb)
		p.r.log.WarnContext(ctx, "sandbox pool: prepare", slog.String("runtime", cls.runtime), slog.Any("error", err))
		p.pause(ctx)
		return false
	}
	p.mu.Lock()
	if p.stopped || p.classes[cls] == nil {
		p.mu.Unlock()
		p.r.retire(ctx, sb)
		return false
	}
	st := p.classes[cls]
	st.idle = append(st.idle, sb)
	s := p.stat(cls.runtime)
	s.Refills++
	s.RefillTime += time.Since(start)
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

// awaitLauncher waits until the sandbox's cgroup holds the launcher beside
// kiln-init and, when it preloads modules, until the launcher has said on
// stdout that it is done (preloadedMarker; arm discards it with the rest of
// the output before the job's). A job armed earlier would share its memory
// limit, CPU budget and wall clock with the preloading: a low memory limit
// would kill the import and be reported as the job's. Bounded: a launcher
// that never gets there is a broken sandbox.
func awaitLauncher(ctx context.Context, sb *sandbox, preloads bool) error {
	cg, err := newCgroupDir(cgroupRoot, cgroupV2(), sb.cgroupsPath)
	if err != nil {
		return err
	}
	start := time.Now()
	running := false
	for {
		var err error
		if !running {
			var pids []int
			pids, err = cg.procs()
			running = err == nil && len(pids) >= 2
		}
		if running && (!preloads || sb.stdout.contains(preloadedMarker)) {
			return nil
		}
		switch {
		case !running && time.Since(start) > launcherStartTimeout:
			return fmt.Errorf("sandbox %s: no launcher process %s after start (%v)", sb.id, launcherStartTimeout, err)
		case time.Since(start) > preloadTimeout:
			return fmt.Errorf("sandbox %s: the launcher did not finish preloading within %s", sb.id, preloadTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// preloadedMarker is what a launcher writes to stdout once it has imported
// the modules KILN_PRELOAD names (deploy/images/python/launch.py).
var preloadedMarker = []byte("\x00kiln-preloaded\n")

const (
	// launcherStartTimeout bounds the wait for the launcher process.
	launcherStartTimeout = 10 * time.Second
	// preloadTimeout bounds the wait for its preloading (pandas takes about
	// half a second of CPU on an idle host; a loaded one takes longer).
	preloadTimeout = time.Minute
)

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
