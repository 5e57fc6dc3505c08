package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/outcome"
)

// Where a box's zygote finds the worker's control socket, the job seccomp
// filter and the host directory that holds each job's work dir.
const (
	boxSocketPath = initDir + "/ctl.sock"
	boxFilterPath = initDir + "/box/job.bpf"
	boxJobsPath   = initDir + "/jobs"
)

// Heartbeats: the worker's lease on the running job, renewed every
// boxHeartbeat; the zygote ends the job when none came for a second.
const boxHeartbeat = 250 * time.Millisecond

// boxCPUWatch is how often a box job's CPU time over all its processes is
// read from the cgroup against its limit.
const boxCPUWatch = 50 * time.Millisecond

// boxRetryAfter is how long after a failed box no new one is tried.
const boxRetryAfter = 2 * time.Second

// boxKillGrace bounds the wait for the zygote's report after the worker
// asked it to end a job; past it the box is stopped whole.
const boxKillGrace = 5 * time.Second

// boxKey is what a box serves: one tenant's jobs of one limits class.
type boxKey struct {
	tenant string
	class  poolClass
}

// boxes holds a Containerd's boxes: neutral ones per class, and the idle
// boxes of each tenant.
type boxes struct {
	r   *Containerd
	cfg BoxConfig

	mu       sync.Mutex
	idle     map[boxKey][]*sandbox
	neutral  map[poolClass][]*sandbox
	creating map[poolClass]int
	live     int // boxes created or being created, idle or busy
	stopped  bool
	// failedAt is when making a box last failed: none is tried again for
	// boxRetryAfter (a broken image or runtime must not spin).
	failedAt time.Time
	// changed is closed (and replaced) whenever a box becomes idle or
	// neutral: what await waits on.
	changed chan struct{}
	// Figures (BoxStats).
	hits, claims, misses, retired, prepared, discarded int64
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

func newBoxes(r *Containerd, cfg BoxConfig) *boxes {
	return &boxes{r: r, cfg: cfg.withDefaults(), idle: map[boxKey][]*sandbox{}, neutral: map[poolClass][]*sandbox{}, creating: map[poolClass]int{}}
}

// boxable reports whether a job of runtime is to run in a box, and under
// which key.
func (r *Containerd) boxable(runtime string, img *imageEntry, lim job.Limits, tenant string) (boxKey, bool) {
	if r.boxes.cfg.Off || !img.profile.Box || img.isolation != IsolationRunc {
		return boxKey{}, false
	}
	return boxKey{tenant: tenant, class: classOf(runtime, img, lim)}, true
}

// take returns an idle box of key's tenant, else a neutral box of its class
// (which becomes the tenant's), else nil. A box never serves two tenants.
func (bx *boxes) take(ctx context.Context, key boxKey, img *imageEntry) *sandbox {
	var dead []*sandbox
	defer func() {
		for _, sb := range dead {
			bx.r.retireBox(ctx, sb)
		}
	}()
	bx.mu.Lock()
	defer bx.mu.Unlock()
	usable := func(sb *sandbox) bool {
		if exitedIdle(sb) || time.Since(sb.prepared) > bx.cfg.MaxAge {
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
			sb.tenant = key.tenant
			bx.claims++
			// Not inline: bx.mu is held, and growBox may retire a
			// victim first.
			go bx.r.growBox(context.WithoutCancel(ctx), key.class, img)
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
		bx.r.growBox(ctx, key.class, img)
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
		// A failed creation is tried again after boxRetryAfter.
		retry := time.NewTimer(boxRetryAfter)
		select {
		case <-changed:
		case <-retry.C:
		case <-ctx.Done():
		}
		retry.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// put returns a box that served a job cleanly to its tenant's idle set.
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

// gone records that a box was retired.
func (bx *boxes) gone() {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	bx.live--
	bx.retired++
}

// BoxStats returns the boxes' figures.
func (r *Containerd) BoxStats() BoxStats {
	bx := r.boxes
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

// boxOfJob names the box running job id ("" when none does).
func (r *Containerd) boxOfJob(id string) string {
	if v, ok := r.running.Load(id); ok {
		return v.(*sandbox).id
	}
	return ""
}

// growBox creates a neutral box of class cls in the background unless the
// class already has its neutral boxes (ready or being made). At the bound,
// the least recently used idle box of any tenant is retired to make room.
func (r *Containerd) growBox(ctx context.Context, cls poolClass, img *imageEntry) {
	bx := r.boxes
	bx.mu.Lock()
	if bx.stopped || len(bx.neutral[cls])+bx.creating[cls] >= max(bx.cfg.Neutral, 1) || time.Since(bx.failedAt) < boxRetryAfter {
		bx.mu.Unlock()
		return
	}
	var victim *sandbox
	if bx.live >= bx.cfg.Max {
		var vk boxKey
		for k, q := range bx.idle {
			if len(q) > 0 && (victim == nil || q[0].lastUsed.Before(victim.lastUsed)) {
				victim, vk = q[0], k
			}
		}
		if victim == nil {
			bx.mu.Unlock()
			return
		}
		bx.idle[vk] = bx.idle[vk][1:]
	}
	bx.creating[cls]++
	bx.live++
	bx.mu.Unlock()
	if victim != nil {
		r.retireBox(ctx, victim)
	}
	r.cleaning.Add(1) // Close waits for it like for a removal
	go func() {
		defer r.cleaning.Done()
		// Its spans stand alone: no job waits for it.
		ctx = trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
		sb, err := r.prepareBox(ctx, cls, img, "")
		bx.mu.Lock()
		bx.creating[cls]--
		ok := err == nil && !bx.stopped
		if err != nil {
			bx.failedAt = time.Now()
		}
		if ok {
			bx.neutral[cls] = append(bx.neutral[cls], sb)
		}
		bx.signal()
		bx.mu.Unlock()
		if !ok {
			if err != nil {
				r.log.WarnContext(ctx, "box", slog.String("runtime", cls.runtime), slog.Any("error", err))
			}
			r.retireBox(ctx, sb)
		}
	}()
}

// seedBoxes makes the neutral boxes of every boxable runtime's default class.
func (r *Containerd) seedBoxes(ctx context.Context) {
	for _, rt := range r.Runtimes() {
		img, err := r.resolve(ctx, rt)
		if err != nil {
			r.log.WarnContext(ctx, "boxes: resolve runtime", slog.String("runtime", rt), slog.Any("error", err))
			continue
		}
		lim, err := r.cfg.Policy.Resolve(img.profile.Limits)
		if err != nil {
			continue
		}
		if key, ok := r.boxable(rt, img, lim, ""); ok {
			for range r.boxes.cfg.Neutral {
				r.growBox(ctx, key.class, img)
			}
		}
	}
}

// prepareBox creates a box for class cls and waits for its zygote to
// connect (after preloading).
func (r *Containerd) prepareBox(ctx context.Context, cls poolClass, img *imageEntry, session string) (*sandbox, error) {
	lim, err := r.creationLimits(img, cls)
	if err != nil {
		return nil, fmt.Errorf("sandbox: box: %w", err)
	}
	// kiln-init's own limits are the box's life, not a job's: each job
	// has its own CPU limit (set in its process, and watched over all its
	// processes) and wall clock (the worker's).
	lim.TimeoutMS = r.boxes.cfg.MaxAge.Milliseconds() + 60_000
	lim.CPUMS = lim.TimeoutMS
	sock := filepath.Join(r.cfg.StateDir, r.cfg.WorkerID, "ctl-"+randomHex(8)+".sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o711); err != nil {
		return nil, fmt.Errorf("sandbox: box: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sandbox: box: control socket: %w", err)
	}
	defer ln.Close() // one connection only: the zygote's; removes the file
	preload := img.profile.Preload
	if mods, ok := r.cfg.Pool.Preload[cls.runtime]; ok {
		preload = mods
	}
	sb, err := r.prepare(ctx, img, prepOpts{lim: lim, preload: preload, class: cls, box: sock, session: session})
	if err != nil {
		return sb, err
	}
	if err := ln.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return sb, err
	}
	conn, err := ln.AcceptUnix()
	if err != nil {
		return sb, fmt.Errorf("sandbox: box %s: the zygote did not connect: %w", sb.id, err)
	}
	sb.ctl, sb.ctlReader = conn, bufio.NewReader(conn)
	if err := r.boxHandshake(sb); err != nil {
		return sb, err
	}
	sb.prepared = time.Now()
	return sb, nil
}

// boxHandshake maps the users of the user namespace the zygote made: it
// says "U" once it has made it; the worker writes the maps for the
// connection's peer (the zygote, by the kernel's word) and answers "M".
func (r *Containerd) boxHandshake(sb *sandbox) error {
	_ = sb.ctl.SetDeadline(time.Now().Add(time.Minute))
	defer sb.ctl.SetDeadline(time.Time{})
	b, err := sb.ctlReader.ReadByte()
	if err != nil || b != 'U' {
		return fmt.Errorf("sandbox: box %s: no user namespace from the zygote (%q): %v%s", sb.id, b, err, stderrTail(sb))
	}
	raw, err := sb.ctl.SyscallConn()
	if err != nil {
		return fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		return fmt.Errorf("sandbox: box %s: the zygote's pid: %v %v", sb.id, err, credErr)
	}
	if int(cred.Uid) != sb.boxBase {
		return fmt.Errorf("sandbox: box %s: the control socket's peer is uid %d, not the box's %d", sb.id, cred.Uid, sb.boxBase)
	}
	if err := mapBoxUsers(sb, cred.Pid); err != nil {
		return err
	}
	// When a job reaches the box's memory limit, the kernel ends the
	// largest process of the cgroup, and a zygote with numpy and pandas is
	// often larger than the job: it is made a less likely victim than the
	// job (whose init raises its own back to oomScoreAdj), yet stays ahead
	// of every host process under host memory pressure.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cred.Pid), []byte(strconv.Itoa(zygoteOOMScoreAdj)), 0); err != nil {
		return fmt.Errorf("sandbox: box %s: the zygote's oom_score_adj: %w", sb.id, err)
	}
	if _, err := sb.ctl.Write([]byte("M")); err != nil {
		return fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	// Then it preloads, and says "R" when jobs may come.
	_ = sb.ctl.SetDeadline(time.Now().Add(boxPreloadTimeout))
	if b, err := sb.ctlReader.ReadByte(); err != nil || b != 'R' {
		return fmt.Errorf("sandbox: box %s: the zygote did not finish preloading (%q): %v%s", sb.id, b, err, stderrTail(sb))
	}
	return nil
}

// zygoteOOMScoreAdj is a box zygote's oom_score_adj (boxHandshake).
const zygoteOOMScoreAdj = 500

// boxPreloadTimeout bounds a zygote's preloading.
const boxPreloadTimeout = 2 * time.Minute

// stderrTail is the last line a box wrote on stderr, for an error message.
func stderrTail(sb *sandbox) string {
	if line := outcome.LastLine(sb.stderr.Tail()); len(line) > 0 {
		return ": " + string(line)
	}
	return ""
}

// retireBox removes a box and frees its place.
func (r *Containerd) retireBox(ctx context.Context, sb *sandbox) {
	r.boxes.gone()
	if sb == nil {
		return
	}
	if sb.ctl != nil {
		sb.ctl.Close()
	}
	if sb.next != nil {
		sb.next.close(r, ctx)
		sb.next = nil
	}
	r.retire(ctx, sb)
}
