package sandbox

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
	"github.com/kilnrun/kiln/worker/sandbox/initproto"
)

// Defaults of RecycleConfig.
const (
	RecycleMaxJobsDefault       = 100
	RecycleMaxAgeDefault        = 10 * time.Minute
	RecycleMaxContainersDefault = 8
)

// Where a recycled sandbox's zygote finds the worker's control socket.
const recycleSocketPath = initDir + "/ctl.sock"

// recycleHeaderSize is the fixed size of a job header on the control socket
// (the launcher's HEADER_SIZE).
const recycleHeaderSize = 32

// RecycleConfig configures recycled sandboxes: a container whose launcher
// stays up as a zygote (its preload modules imported once) and forks each
// job of one tenant as a fresh process, wiping what a job can leave behind
// between two jobs. A recycled container serves one tenant only, one job at
// a time. Recycling is opt-in: for a runtime here, or for a tenant whose
// jobs ask for it (Hooks.Recycle, from the API key file), and only for a
// runtime whose profile supports it (RuntimeProfile.Recycle) under runc.
type RecycleConfig struct {
	// Runtimes lists runtimes whose jobs are recycled for every tenant.
	// Default: none.
	Runtimes []string
	// Off refuses recycling altogether, tenants' requests included.
	Off bool
	// MaxJobs is how many jobs a container serves before it is retired.
	// Default: RecycleMaxJobsDefault (100).
	MaxJobs int
	// MaxAge is how long a container serves jobs before it is retired.
	// Default: RecycleMaxAgeDefault (10 minutes).
	MaxAge time.Duration
	// MaxContainers bounds the recycled containers of this runtime, idle or
	// busy, across tenants; an idle one of another tenant is retired to
	// make room. Default: RecycleMaxContainersDefault (8).
	MaxContainers int
}

func (c RecycleConfig) withDefaults() RecycleConfig {
	c.MaxJobs = cmp.Or(c.MaxJobs, RecycleMaxJobsDefault)
	c.MaxAge = cmp.Or(c.MaxAge, RecycleMaxAgeDefault)
	c.MaxContainers = cmp.Or(c.MaxContainers, RecycleMaxContainersDefault)
	return c
}

// recycleKey is what a recycled container serves: one tenant's jobs of one
// limits class.
type recycleKey struct {
	tenant string
	class  poolClass
}

// recycler holds a Containerd's recycled containers.
type recycler struct {
	r   *Containerd
	cfg RecycleConfig

	mu       sync.Mutex
	idle     map[recycleKey][]*sandbox
	creating map[recycleKey]bool
	live     int // containers created or being created, idle or busy
	stopped  bool
	// Figures, for PoolStats-like reporting.
	hits, misses, retired int64
}

func newRecycler(r *Containerd, cfg RecycleConfig) *recycler {
	return &recycler{r: r, cfg: cfg.withDefaults(), idle: map[recycleKey][]*sandbox{}, creating: map[recycleKey]bool{}}
}

// recyclable reports whether a job of runtime with hooks h is to run on a
// recycled container, and under which key.
func (r *Containerd) recyclable(runtime string, img *imageEntry, lim job.Limits, h Hooks) (recycleKey, bool) {
	rc := r.recycler.cfg
	if rc.Off || !img.profile.Recycle || img.isolation != IsolationRunc || h.Tenant == "" {
		return recycleKey{}, false
	}
	if !h.Recycle && !slices.Contains(rc.Runtimes, runtime) {
		return recycleKey{}, false
	}
	return recycleKey{tenant: h.Tenant, class: classOf(runtime, img, lim)}, true
}

// take returns an idle recycled container of key, or nil.
func (rc *recycler) take(ctx context.Context, key recycleKey) *sandbox {
	var dead []*sandbox
	defer func() {
		for _, sb := range dead {
			rc.r.retireRecycled(ctx, sb)
		}
	}()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for q := rc.idle[key]; len(q) > 0; q = rc.idle[key] {
		sb := q[len(q)-1] // the most recently used: its pages are warm
		rc.idle[key] = q[:len(q)-1]
		if exitedIdle(sb) || time.Since(sb.prepared) > rc.cfg.MaxAge {
			dead = append(dead, sb)
			continue
		}
		rc.hits++
		return sb
	}
	rc.misses++
	return nil
}

// put returns a container that served a job cleanly to the idle set.
func (rc *recycler) put(key recycleKey, sb *sandbox) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stopped {
		return false
	}
	rc.idle[key] = append(rc.idle[key], sb)
	return true
}

// gone records that a recycled container was retired.
func (rc *recycler) gone() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.live--
	rc.retired++
}

// RecycleStats are the recycled containers' figures.
type RecycleStats struct {
	Idle, Live            int
	Hits, Misses, Retired int64
}

// RecycleStats returns the recycled containers' figures.
func (r *Containerd) RecycleStats() RecycleStats {
	rc := r.recycler
	rc.mu.Lock()
	defer rc.mu.Unlock()
	s := RecycleStats{Live: rc.live, Hits: rc.hits, Misses: rc.misses, Retired: rc.retired}
	for _, q := range rc.idle {
		s.Idle += len(q)
	}
	return s
}

// grow starts creating a recycled container for key in the background,
// unless one is being created or the bound is reached (an idle container of
// another key is then retired to make room for the next miss).
func (r *Containerd) grow(ctx context.Context, key recycleKey, img *imageEntry) {
	rc := r.recycler
	rc.mu.Lock()
	if rc.stopped || rc.creating[key] {
		rc.mu.Unlock()
		return
	}
	if rc.live >= rc.cfg.MaxContainers {
		var victim *sandbox
		for k, q := range rc.idle {
			if k != key && len(q) > 0 {
				victim, rc.idle[k] = q[0], q[1:]
				break
			}
		}
		rc.mu.Unlock()
		if victim != nil {
			r.retireRecycled(ctx, victim)
		}
		return
	}
	rc.creating[key] = true
	rc.live++
	rc.mu.Unlock()
	r.cleaning.Add(1) // Close waits for it like for a removal
	go func() {
		defer r.cleaning.Done()
		// Its spans stand alone: the job that missed does not wait for it.
		ctx = trace.ContextWithSpanContext(context.WithoutCancel(ctx), trace.SpanContext{})
		sb, err := r.prepareRecycled(ctx, key, img)
		rc.mu.Lock()
		delete(rc.creating, key)
		rc.mu.Unlock()
		if err != nil {
			r.log.WarnContext(ctx, "recycled sandbox", slog.String("tenant", key.tenant), slog.Any("error", err))
			r.retireRecycled(ctx, sb)
			return
		}
		if !rc.put(key, sb) {
			r.retireRecycled(ctx, sb)
		}
	}()
}

// prepareRecycled creates a recycled container for key and waits for its
// zygote to connect.
func (r *Containerd) prepareRecycled(ctx context.Context, key recycleKey, img *imageEntry) (*sandbox, error) {
	lim, err := r.creationLimits(img, key.class)
	if err != nil {
		return nil, fmt.Errorf("sandbox: recycled: %w", err)
	}
	// kiln-init's own limits are the container's life, not a job's: each
	// job has its own CPU limit (set in its process) and wall clock (the
	// worker's).
	lim.TimeoutMS = r.recycler.cfg.MaxAge.Milliseconds() + 60_000
	lim.CPUMS = lim.TimeoutMS
	sock := filepath.Join(r.cfg.StateDir, r.cfg.WorkerID, "ctl-"+randomHex(8)+".sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o711); err != nil {
		return nil, fmt.Errorf("sandbox: recycled: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sandbox: recycled: control socket: %w", err)
	}
	defer ln.Close() // one connection only: the zygote's; removes the file
	preload := img.profile.Preload
	if mods, ok := r.cfg.Pool.Preload[key.class.runtime]; ok {
		preload = mods
	}
	sb, err := r.prepare(ctx, img, prepOpts{lim: lim, preload: preload, class: key.class, recycle: sock})
	if sb != nil {
		sb.recycled, sb.tenant = true, key.tenant
	}
	if err != nil {
		return sb, err
	}
	if err := ln.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return sb, err
	}
	conn, err := ln.AcceptUnix()
	if err != nil {
		return sb, fmt.Errorf("sandbox: recycled %s: the zygote did not connect: %w", sb.id, err)
	}
	sb.ctl, sb.ctlReader = conn, bufio.NewReader(conn)
	sb.prepared = time.Now()
	return sb, nil
}

// retireRecycled removes a recycled container and frees its place.
func (r *Containerd) retireRecycled(ctx context.Context, sb *sandbox) {
	if sb == nil {
		r.recycler.gone()
		return
	}
	if sb.ctl != nil {
		sb.ctl.Close()
	}
	r.recycler.gone()
	r.retire(ctx, sb)
}

// zygoteReport is the launcher's JSON line after each job.
type zygoteReport struct {
	Ready    bool   `json:"ready"`
	ExitCode int    `json:"exit_code"`
	Signal   int    `json:"signal"`
	CPUMicro int64  `json:"cpu_us"`
	Clean    bool   `json:"clean"`
	Error    string `json:"error"`
}

// runRecycled runs one job on a recycled container and returns it to the
// idle set, or retires it after any anomaly.
func (r *Containerd) runRecycled(ctx context.Context, sb *sandbox, key recycleKey, id string, spec job.Spec, lim job.Limits, res job.Result,
	e ending) (job.Result, error) {
	markPooled(ctx, true)
	trace.SpanFromContext(ctx).SetAttributes(ktrace.SandboxRecycledKey.Bool(true))
	keep := false
	defer func() {
		if keep && r.recycler.put(key, sb) {
			return
		}
		r.retireRecycled(ctx, sb)
		if !errors.Is(ctx.Err(), context.Canceled) {
			// The tenant is sending jobs: its next one finds a replacement.
			r.grow(ctx, key, sb.img)
		}
	}()
	if err := r.arm(ctx, sb, id, lim); err != nil {
		// A job whose memory limit is below what the zygote holds runs on
		// a sandbox of its own; the container waits for the next job.
		keep = errors.Is(err, errUnfit)
		return res, fmt.Errorf("sandbox: recycled %s: %w", sb.id, err)
	}
	body, err := frameJSON(spec, int64(cpuLimitSeconds(lim)))
	if err != nil {
		return res, err
	}
	wctx, span := r.tracer.Start(ctx, ktrace.SpanSandboxWait, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(id)))
	defer span.End()
	outs, err := r.sendJob(sb, body, spec.Stdin)
	if err != nil {
		endSpan(span, err)
		return res, err
	}
	started := time.Now()
	reports := make(chan zygoteReport, 1)
	readErr := make(chan error, 1)
	go func() {
		line, err := sb.ctlReader.ReadBytes('\n')
		var rep zygoteReport
		if err == nil {
			err = json.Unmarshal(line, &rep)
		}
		if err != nil {
			readErr <- err
			return
		}
		reports <- rep
	}()
	timer := time.NewTimer(lim.Timeout())
	defer timer.Stop()
	var rep zygoteReport
	select {
	case rep = <-reports:
	case err := <-readErr:
		// The zygote is gone: killed by the job (same user), or crashed.
		r.stopTask(ctx, sb)
		e.Init, e.InitErr = nil, fmt.Errorf("the sandbox's supervisor ended before reporting the job: %v", err)
		if ex, ok := zygoteKilled(sb); ok {
			e.InitErr = fmt.Errorf("%w (the program ended the supervisor: %s)", e.InitErr, ex)
		}
	case <-sb.exitCh:
		sb.exited = true
		e.InitErr = errors.New("the recycled sandbox ended before reporting the job")
	case <-timer.C:
		e.TimedOut = true
	case <-wctx.Done():
		e.Canceled = true
	}
	res.WallMS = time.Since(started).Milliseconds()
	if e.TimedOut || e.Canceled {
		r.stopTask(ctx, sb)
	}
	// Every process of the job is gone now (the zygote killed them, or the
	// task is dead): the pipes reach their end.
	outs.wait(r, ctx, sb)
	e.Usage = r.cgroupUsage(ctx, sb)
	if e.InitErr == nil && !e.TimedOut && !e.Canceled {
		e.Init = &initproto.Status{Ready: rep.Ready, ExitCode: rep.ExitCode, Signal: rep.Signal, CPUMicros: rep.CPUMicro}
		sb.jobEnded = true
		r.collectArtifacts(ctx, sb, &res)
		sb.jobEnded = false
		sb.jobs++
		keep = rep.Clean && e.Usage.OOMKills == 0 && sb.jobs < r.recycler.cfg.MaxJobs &&
			time.Since(sb.prepared) < r.recycler.cfg.MaxAge && r.onlySupervisor(sb)
		if !rep.Clean {
			r.log.WarnContext(ctx, "recycled sandbox retired: the wipe after a job failed", slog.String("container_id", sb.id), slog.String("error", rep.Error))
		}
		if keep {
			if err := resetWorkDir(filepath.Join(sb.workHost, "work"), sb.uid); err != nil {
				r.log.WarnContext(ctx, "recycled sandbox retired: wipe its work dir", slog.String("container_id", sb.id), slog.Any("error", err))
				keep = false
			}
		}
	}
	e.CPULimit = time.Duration(cpuLimitSeconds(lim)) * time.Second
	result := judge(span, sb, res, e, e.Usage.CPU)
	if e.InitErr != nil && result.Status == job.StatusInternalError {
		// Whatever ended the supervisor happened while the job ran; the job
		// is judged, not retried: the job is the likeliest cause.
		result.Status = job.StatusFailed
		result.Error = job.NewFailure(job.CategoryRuntimeError, e.InitErr.Error())
	}
	return result, nil
}

// zygoteKilled reports how the zygote ended when the task's init says so.
func zygoteKilled(sb *sandbox) (string, bool) {
	st, err := readStatus(sb.statusPath, sb.nonce)
	if err != nil {
		return "", false
	}
	if st.Signal != 0 {
		return signalName(st.Signal), true
	}
	return fmt.Sprintf("exit %d", st.ExitCode), true
}

// jobOutput is the copying of one recycled job's stdout and stderr.
type jobOutput struct{ done chan struct{} }

// sendJob hands the zygote the job: the header with the job's stdin,
// stdout and stderr descriptors, then the frame; then writes the job's stdin.
func (r *Containerd) sendJob(sb *sandbox, body []byte, stdin string) (*jobOutput, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: recycled: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("sandbox: recycled: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW} {
			f.Close()
		}
		return nil, fmt.Errorf("sandbox: recycled: %w", err)
	}
	head := fmt.Appendf(nil, "%s %-*d\n", frameMagic, recycleHeaderSize-len(frameMagic)-2, len(body))
	rights := unix.UnixRights(int(inR.Fd()), int(outW.Fd()), int(errW.Fd()))
	_, _, err = sb.ctl.WriteMsgUnix(head, rights, nil)
	if err == nil {
		_, err = sb.ctl.Write(body)
	}
	// The zygote holds its own copies now.
	inR.Close()
	outW.Close()
	errW.Close()
	out := &jobOutput{done: make(chan struct{}, 2)}
	for _, c := range []struct {
		f      *os.File
		stream string
		buf    *cappedBuffer
	}{{outR, "stdout", sb.stdout}, {errR, "stderr", sb.stderr}} {
		go func() {
			_, _ = io.Copy(streamWriter{sb, c.stream, c.buf}, c.f)
			c.f.Close()
			out.done <- struct{}{}
		}()
	}
	go func() {
		if stdin != "" {
			_, _ = io.WriteString(inW, stdin)
		}
		inW.Close()
	}()
	if err != nil {
		return out, fmt.Errorf("sandbox: recycled %s: send the job: %w", sb.id, err)
	}
	return out, nil
}

// wait waits for both streams to end (every writer is dead by now).
func (o *jobOutput) wait(r *Containerd, ctx context.Context, sb *sandbox) {
	if o == nil {
		return
	}
	deadline := time.After(outputDrainTimeout)
	for range 2 {
		select {
		case <-o.done:
		case <-deadline:
			r.log.WarnContext(ctx, "recycled sandbox output not drained in time", slog.String("container_id", sb.id))
			return
		}
	}
}

// cgroupUsage reads the job's figures from the cgroup itself against the
// baselines taken at arm (a pooled or recycled sandbox): a few file reads
// instead of a round trip through containerd and the shim.
func (r *Containerd) cgroupUsage(ctx context.Context, sb *sandbox) usage {
	var u usage
	cg, err := newCgroupDir(cgroupRoot, cgroupV2(), sb.cgroupsPath)
	if err != nil {
		return u
	}
	var errs []error
	cpu, err := cg.cpuUsage()
	errs = append(errs, err)
	u.CPU = max(cpu-sb.cpuBase, 0)
	oom, err := cg.oomKills()
	errs = append(errs, err)
	u.OOMKills = oom - min(oom, sb.oomBase)
	if sb.peakFile != nil {
		u.MemoryPeak, _ = readPeakFile(sb.peakFile)
	} else if cg.v2 {
		u.MemoryPeak, _ = readMemoryPeak(cgroup2Root, sb.cgroupsPath)
	} else {
		swap, err := cg.readInt("memory", "memory.memsw.max_usage_in_bytes")
		mem, err2 := cg.readInt("memory", "memory.max_usage_in_bytes")
		if err != nil {
			swap = 0
		}
		errs = append(errs, err2)
		u.MemoryPeak = max(mem, swap)
	}
	if err := errors.Join(errs...); err != nil {
		r.log.WarnContext(ctx, "recycled sandbox figures", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	return u
}

// onlySupervisor reports whether the sandbox holds no process but kiln-init
// and the zygote (a process that survived the zygote's kill would share the
// next job's container).
func (r *Containerd) onlySupervisor(sb *sandbox) bool {
	cg, err := newCgroupDir(cgroupRoot, cgroupV2(), sb.cgroupsPath)
	if err != nil {
		return false
	}
	pids, err := cg.procs()
	if err != nil || len(pids) != 2 {
		r.log.WarnContext(context.Background(), "recycled sandbox retired: processes left after the job", slog.String("container_id", sb.id), slog.Int("processes", len(pids)))
		return false
	}
	return true
}

// resetWorkDir empties the host side of a recycled sandbox's work dir and
// makes its output dir again, owned by uid. Every process of the job is
// gone; nothing is followed (RemoveAll removes a symlink, not its target).
func resetWorkDir(work string, uid int) error {
	ents, err := os.ReadDir(work)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(work, e.Name())); err != nil {
			return err
		}
	}
	out := filepath.Join(work, filepath.Base(job.OutputDir))
	if err := os.Mkdir(out, 0o755); err != nil {
		return err
	}
	return os.Chown(out, uid, uid)
}

// stopRecycler retires every idle recycled container (Close).
func (r *Containerd) stopRecycler(ctx context.Context) {
	rc := r.recycler
	rc.mu.Lock()
	rc.stopped = true
	var all []*sandbox
	for k, q := range rc.idle {
		all = append(all, q...)
		delete(rc.idle, k)
	}
	rc.mu.Unlock()
	for _, sb := range all {
		r.retireRecycled(ctx, sb)
	}
}
