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

	boxsrc "github.com/kilnrun/kiln/sandbox/box"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
	"github.com/kilnrun/kiln/sandbox/outcome"
)

// boxClient is the worker's side of its boxes: it makes a box and its
// control connection (prepareBox), runs a job in a fresh inner sandbox of
// one (box_run.go, box_io.go), makes the next job's sandbox ahead
// (box_prepared.go), keeps a spare box for the next session
// (session_spare.go), and holds the box source (package box) that decides
// which box a job gets.
type boxClient struct {
	cfg      Config
	boxCfg   BoxConfig // cfg.Boxes with its defaults
	log      *slog.Logger
	ct       *lifecycle
	hostSide *hostSide
	live     *liveSet
	images   *imageCache
	cpool    *containerPool // the classes' limits
	exec     *executor
	boxes    *boxsrc.Source[*sandbox, poolClass, *imageEntry] // the box source (package box), over boxMaker
	spares   sessionSpares                                    // a ready box per runtime for the next session (session_spare.go)
	running  sync.Map                                         // job id → the box running it
}

// Heartbeats: the worker's lease on the running job, renewed every
// boxHeartbeat; the zygote ends the job when none came for a second.
const boxHeartbeat = 250 * time.Millisecond

// boxCPUWatch is how often a box job's CPU time over all its processes is
// read from the cgroup against its limit.
const boxCPUWatch = 50 * time.Millisecond

// boxKillGrace bounds the wait for the zygote's report after the worker
// asked it to end a job; past it the box is stopped whole.
const boxKillGrace = 5 * time.Second

// boxUse is what a box is asked for: a job's (every tenant's boxes, or
// the tenant's own), or a session's.
type boxUse int

const (
	boxShared  boxUse = iota // a job's box, shared between tenants
	boxTenant                // a job's box, the tenant's own
	boxSession               // a session's box, the tenant's own
)

// boxable reports whether a job or session of runtime is to run in a box,
// and under which key: the boxes of its class that serve every tenant, or
// the tenant's own (dedicated boxes, a session). A runtime whose jobs do
// not run in boxes may still host sessions through its session launcher.
func (c BoxConfig) boxable(runtime string, img *imageEntry, lim job.Limits, tenant string, use boxUse) (boxsrc.Key[poolClass], bool) {
	ok := img.profile.Box
	if use == boxSession {
		ok = img.profile.HostsSessions()
	}
	if c.Off || !ok || img.isolation != IsolationRunc {
		return boxsrc.Key[poolClass]{}, false
	}
	key := boxsrc.Key[poolClass]{Class: classOf(runtime, img, lim)}
	if use != boxShared {
		key.Tenant = tenant
	}
	return key, true
}

// jobBoxUse is a job's boxUse: its tenant's own boxes when it has
// dedicated ones.
func jobBoxUse(dedicated bool) boxUse {
	if dedicated {
		return boxTenant
	}
	return boxShared
}

// BoxStats returns the boxes' figures.
func (r *Containerd) BoxStats() BoxStats {
	bs := r.box.boxes.Stats()
	st := BoxStats{Idle: bs.Idle, Neutral: bs.Neutral, Live: bs.Live, Hits: bs.Hits, Claims: bs.Claims, Misses: bs.Misses,
		Retired: bs.Retired, Prepared: bs.Prepared, Discarded: bs.Discarded}
	for _, sb := range r.box.boxes.Waiting() {
		if cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath); err == nil {
			if n, err := cg.MemoryUsage(); err == nil {
				st.IdleMemory += n
			}
		}
	}
	return st
}

// boxOfJob names the box running job id ("" when none does).
func (b *boxClient) boxOfJob(id string) string {
	if v, ok := b.running.Load(id); ok {
		return v.(*sandbox).id
	}
	return ""
}

// seedBoxes makes the neutral boxes of every boxable runtime's default
// class, preloaded and lean.
func (b *boxClient) seedBoxes(ctx context.Context) {
	for _, rt := range runtimeNames(b.cfg) {
		img, err := b.images.resolve(ctx, rt)
		if err != nil {
			b.log.WarnContext(ctx, "boxes: resolve runtime", slog.String("runtime", rt), slog.Any("error", err))
			continue
		}
		cls, boxed, err := b.cpool.defaultClass(rt, img)
		if err != nil || !boxed {
			continue
		}
		lean := cls
		lean.lean = true
		for range b.boxCfg.Neutral {
			b.boxes.Grow(ctx, cls, img)
			if len(preloadOf(b.cfg.Pool, rt, img)) > 0 {
				b.boxes.Grow(ctx, lean, img)
			}
		}
	}
}

// boxMaker is how the box source (package box) makes and ends its boxes:
// through the containerd backend.
type boxMaker struct{ b *boxClient }

var _ boxsrc.Maker[*sandbox, poolClass, *imageEntry] = boxMaker{}

// MakeBox is a box source's box: a box of no session.
func (m boxMaker) MakeBox(ctx context.Context, cls poolClass, img *imageEntry) (*sandbox, error) {
	return m.b.prepareBox(ctx, cls, img, boxFor{})
}

// boxFor is what a box is made for beyond its class: a session's box is
// labelled with the session's id, and runs the runtime's session launcher
// when it has one; a lean box's zygote preloads nothing (as a box of a
// lean class's).
type boxFor struct {
	session string
	lean    bool
}

// prepareBox creates a box for class cls and waits for its zygote to
// connect (after preloading).
func (b *boxClient) prepareBox(ctx context.Context, cls poolClass, img *imageEntry, f boxFor) (*sandbox, error) {
	lim, err := b.cpool.creationLimits(img, cls)
	if err != nil {
		return nil, fmt.Errorf("sandbox: box: %w", err)
	}
	// kiln-init's own limits are the box's life, not a job's: each job
	// has its own CPU limit (set in its process, and watched over all its
	// processes) and wall clock (the worker's).
	lim.TimeoutMS = b.boxCfg.MaxAge.Milliseconds() + 60_000
	lim.CPUMS = lim.TimeoutMS
	sockName := "ctl-" + randomHex(8) + ".sock"
	sock := filepath.Join(b.cfg.StateDir, b.cfg.WorkerID, sockName)
	// Owned while it is bound, so start-up reaping (reapWorkDirs) leaves it.
	b.live.track(sockName, true)
	defer b.live.track(sockName, false)
	if err := os.MkdirAll(filepath.Dir(sock), 0o711); err != nil {
		return nil, fmt.Errorf("sandbox: box: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sandbox: box: control socket: %w", err)
	}
	defer ln.Close() // one connection only: the zygote's; removes the file
	preload := preloadOf(b.cfg.Pool, cls.runtime, img)
	if f.lean || cls.lean {
		preload = nil
	}
	if len(preload) > 0 {
		// Room for the zygote's preloading on top of a job's limit; each
		// job's arm sets the limit to the zygote's baseline plus the job's.
		lim.MemoryMB += preloadAllowanceMB
	}
	o := prepOpts{lim: lim, preload: preload, class: cls, box: sock, session: f.session}
	if !img.profile.Box {
		// A session's box of a runtime whose launcher is not a box
		// supervisor (boxable, boxSession): the session launcher
		// supervises it, and runs the runtime's launcher as the session's
		// interpreter.
		o.interpreter = img.profile.SessionInterpreter(img.args, lim.MemoryMB)
	}
	sb, err := b.ct.prepare(ctx, img, o)
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
	sb.box.ctl, sb.box.ctlReader = conn, bufio.NewReader(conn)
	sb.undo.push(b.closeBoxStep(sb))
	if err := boxHandshake(sb); err != nil {
		return sb, err
	}
	// What the box holds once preloaded, before any job: a job's memory
	// limit is counted on top of it (arm), and its peak without it.
	if sb.baseline, err = preloadBaseline(sb); err != nil {
		return sb, fmt.Errorf("sandbox: box %s: its baseline memory: %w", sb.id, err)
	}
	// Before any job: what the box holds is its supervisors alone.
	if sb.box.supervisors, err = boxProcs(sb); err != nil {
		return sb, fmt.Errorf("sandbox: box %s: its supervisors: %w", sb.id, err)
	}
	sb.prepared = b.boxCfg.Now()
	return sb, nil
}

// boxHandshake maps the users of the user namespace the zygote made: it
// says "U" once it has made it; the worker writes the maps for the
// connection's peer (the zygote, by the kernel's word) and answers "M".
func boxHandshake(sb *sandbox) error {
	_ = sb.box.ctl.SetDeadline(time.Now().Add(time.Minute))
	defer sb.box.ctl.SetDeadline(time.Time{})
	b, err := sb.box.ctlReader.ReadByte()
	if err != nil || b != 'U' {
		return fmt.Errorf("sandbox: box %s: no user namespace from the zygote (%q): %v%s", sb.id, b, err, stderrTail(sb))
	}
	raw, err := sb.box.ctl.SyscallConn()
	if err != nil {
		return fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		return fmt.Errorf("sandbox: box %s: the zygote's pid: %v %v", sb.id, err, credErr)
	}
	if int(cred.Uid) != sb.box.base {
		return fmt.Errorf("sandbox: box %s: the control socket's peer is uid %d, not the box's %d", sb.id, cred.Uid, sb.box.base)
	}
	if err := mapBoxUsers(sb, cred.Pid); err != nil {
		return err
	}
	// When a job reaches the box's memory limit, the kernel ends the
	// largest process of the cgroup, and a zygote with numpy and pandas is
	// often larger than the job: it is made a less likely victim than the
	// job (whose init raises its own back to ctrd.OOMScoreAdj), yet stays ahead
	// of every host process under host memory pressure.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cred.Pid), []byte(strconv.Itoa(zygoteOOMScoreAdj)), 0); err != nil {
		return fmt.Errorf("sandbox: box %s: the zygote's oom_score_adj: %w", sb.id, err)
	}
	if _, err := sb.box.ctl.Write([]byte("M")); err != nil {
		return fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	// Then it preloads, and says "R" when jobs may come.
	_ = sb.box.ctl.SetDeadline(time.Now().Add(boxPreloadTimeout))
	if b, err := sb.box.ctlReader.ReadByte(); err != nil || b != 'R' {
		return fmt.Errorf("sandbox: box %s: the zygote did not finish preloading (%q): %v%s", sb.id, b, err, stderrTail(sb))
	}
	return nil
}

// preloadBaseline is the memory a sandbox's cgroup is charged once its
// launcher (a box's zygote, or a pooled sandbox's launcher) has preloaded:
// the interpreter, the preloaded modules and the pages of the files they
// were read from. A box's jobs share these pages with the zygote, a pooled
// sandbox's job runs on top of them; what a job allocates or copies beyond
// them is its own.
func preloadBaseline(sb *sandbox) (int64, error) {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return 0, err
	}
	return cg.MemoryUsage()
}

// preloadAllowanceMB is the memory a box or pooled sandbox with a preload
// list is created with beyond its class's limit, for the preloading (the
// python image's measured ~250 MB; docs/decisions/preload.md). It bounds
// the sandbox only until its first job is armed.
const preloadAllowanceMB = 768

// preloadAllowanceCPUMS is the CPU time a pooled sandbox that preloads is
// created with beyond its class's limit: preloadTimeout of one CPU, more
// than the agent list's 2–3 s on a loaded host.
const preloadAllowanceCPUMS = 60_000

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

// retireBox removes a box of the box source and frees its place.
func (b *boxClient) retireBox(ctx context.Context, sb *sandbox) { b.boxes.Retire(ctx, sb) }

// EndBox stops and removes a box (boxMaker); its undo stack closes the
// control socket and the inner sandbox made ahead (closeBoxStep).
func (m boxMaker) EndBox(ctx context.Context, sb *sandbox) { m.b.ct.retire(ctx, sb) }

// closeBoxStep is the undo step of a box's control connection: the zygote
// ends with its socket, and the worker's side of the inner sandbox made
// ahead of a job that will not come (its pipes, its work dir) goes.
func (b *boxClient) closeBoxStep(sb *sandbox) func(context.Context, *teardown) {
	return func(ctx context.Context, _ *teardown) {
		sb.box.ctl.Close()
		if sb.box.next != nil {
			sb.box.next.close(b, ctx)
			sb.box.next = nil
		}
	}
}
