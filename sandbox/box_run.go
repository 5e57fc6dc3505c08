package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	boxsrc "github.com/kilnrun/kiln/sandbox/box"

	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/artifacts"
	"github.com/kilnrun/kiln/sandbox/initproto"
	"github.com/kilnrun/kiln/sandbox/outcome"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Running one job in a box: the parameters of its inner sandbox, the job
// handed to the zygote, the lease held while it runs, and the judgement.

// boxParams is what the zygote makes a job's sandbox of.
type boxParams = initproto.BoxParams

// runInBox runs a planned job in a fresh inner sandbox of a box of key: an
// idle one, or a neutral one, waited for when boxes are. done is false when
// the job is to run in a container of its own instead (no box came, or the
// box cannot serve its limits).
func (b *boxClient) runInBox(ctx context.Context, key boxsrc.Key[poolClass], pl plan, res job.Result) (out job.Result, err error, done bool) {
	sb := b.current(ctx, b.boxes.Take(ctx, key, pl.img), pl.img)
	if sb == nil {
		sb = b.current(ctx, b.boxes.Await(ctx, key, pl.img), pl.img)
	}
	if sb == nil {
		b.boxes.Demand(ctx, key.Class, pl.img)
		return res, nil, false
	}
	out, err = b.runBox(ctx, sb, key, pl, res)
	if errors.Is(err, errUnfit) {
		return res, nil, false
	}
	if err != nil {
		out, err = failed(ctx, res, err)
	}
	return out, err, true
}

// current is sb if it was made from img, the image the job is planned
// on (and its result names); a box of an image since rebuilt is retired
// instead, and nil returned: the job then finds or awaits a box as if
// none were idle, and the boxes made for it are of img.
func (b *boxClient) current(ctx context.Context, sb *sandbox, img *imageEntry) *sandbox {
	if sb == nil || sb.img.digest == img.digest {
		return sb
	}
	b.log.InfoContext(ctx, "box retired: its image was replaced", slog.String("container_id", sb.id),
		slog.String("image", sb.img.ref), slog.String("digest", sb.img.digest.String()), slog.String("now", img.digest.String()))
	b.boxes.Retire(ctx, sb)
	return nil
}

// runBox runs one job in a fresh inner sandbox of box sb and returns the
// box to its key's idle set, or retires it after any anomaly.
func (b *boxClient) runBox(ctx context.Context, sb *sandbox, key boxsrc.Key[poolClass], pl plan, res job.Result) (job.Result, error) {
	req, lim := pl.req, pl.lim
	markPooled(ctx, true)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(ktrace.SandboxBoxKey.Bool(true), ktrace.ContainerImageNameKey.String(sb.img.ref),
		ktrace.OCIManifestDigestKey.String(sb.img.digest.String()), ktrace.ContainerIDKey.String(sb.id))
	keep := false
	var next *boxParams // what the box's next sandbox is made of, once known
	defer func() {
		sb.box.lastUsed = b.boxCfg.Now()
		if keep && next != nil {
			if err := b.prepareNext(ctx, sb, *next); err != nil {
				b.log.WarnContext(ctx, "box retired: its next sandbox could not be prepared", slog.String("container_id", sb.id), slog.Any("error", err))
				keep = false
			}
		}
		if keep && b.boxes.Put(key, sb) {
			return
		}
		b.retireBox(ctx, sb)
		if !errors.Is(ctx.Err(), context.Canceled) {
			b.boxes.Grow(ctx, key.Class, sb.img)
		}
	}()
	if err := b.exec.arm(ctx, sb, req, lim); err != nil {
		// A job whose memory limit is below what the zygote holds runs in
		// a container of its own; the box waits for the next job.
		keep = errors.Is(err, errUnfit)
		return res, fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	p := boxParams{CPUS: ctrd.CPULimitSeconds(lim), FSize: lim.DiskMB << 20, NoFile: ctrd.OpenFilesLimit,
		TmpMB: lim.DiskMB, RMem: "4096 131072 " + ctrd.SocketBufferMax, WMem: "4096 16384 " + ctrd.SocketBufferMax}
	// A network job's proxy listener is made in its sandbox's namespace
	// as the sandbox is made: it never takes a prepared one.
	prep, err := b.takePrepared(ctx, sb, p, !req.Spec.Network.Empty())
	if err != nil {
		return res, err
	}
	var jw *jobWork
	if prep != nil {
		jw = prep.jw
	} else if jw, err = newJobWork(sb); err != nil {
		jw.remove(b, ctx)
		return res, err
	}
	defer jw.remove(b, ctx)
	sb.box.jobDir = jw.dir
	defer func() { sb.box.jobDir = "" }()
	b.running.Store(req.ID, sb)
	defer b.running.Delete(req.ID)
	nextP := p // before the uid and work dir are the job's
	next = &nextP
	p.UID, p.Work = jw.uid, jw.name
	t, err := newBoxTarget(b, sb, p, pl.frame, req, prep, artifactsOfJob)
	if err != nil {
		return res, err
	}
	defer t.close()
	t.listenFn = func(ctx context.Context) (net.Listener, error) { return receiveListener(ctx, t.egress) }
	result, err := b.exec.execute(ctx, t, req, lim, res, b.exec.endingFor(ctx, req.Spec.Runtime, sb.img, lim))
	if err != nil {
		return res, err
	}
	sb.box.jobs++
	rep := t.rep
	keep = t.ended.InitErr == nil && rep.Clean && !rep.LeaseLapsed && sb.box.jobs < b.boxCfg.MaxJobs &&
		b.boxCfg.Now().Sub(sb.prepared) < b.boxCfg.MaxAge && b.onlySupervisor(sb)
	if !rep.Clean && rep.Error != "" {
		b.log.WarnContext(ctx, "box retired", slog.String("container_id", sb.id), slog.String("error", rep.Error))
	}
	return result, nil
}

// artifactsOf says whether a box run's output dir is collected as its
// artifacts: a job's is, a session call's is not (its /work is the
// session's, read through its files).
type artifactsOf bool

const (
	artifactsOfJob  artifactsOf = true
	artifactsOfCall artifactsOf = false
)

// boxTarget is a run in an inner sandbox of a box: a job, made at delivery
// or ahead of it (prep), or a session's call in the inner sandbox it keeps.
// The zygote reaps the run's process and reports how it ended on the
// control socket; the worker holds its lease with heartbeats meanwhile.
type boxTarget struct {
	b        *boxClient
	sb       *sandbox
	p        boxParams
	frame    []byte
	stdin    string
	prep     *preparedJob
	collect  artifactsOf
	egress   *net.UnixConn // the worker's end of the egress channel (a run with a network)
	theirs   *os.File      // the zygote's end, sent with the run's header
	listenFn func(context.Context) (net.Listener, error)
	outs     *jobOutput
	// undelivered is why the run never reached the zygote, which had
	// ended (deliver); nil once delivered.
	undelivered error
	// rep is the zygote's report and ended how the run ended, once watched.
	rep   initproto.ZygoteReport
	ended ending
}

// newBoxTarget is the run of req on box sb with inner-sandbox parameters p
// (its uid and work dir set); for a run with a network, the egress
// channel's pair is made and the port set. close releases what it holds.
func newBoxTarget(b *boxClient, sb *sandbox, p boxParams, frame []byte, req Request, prep *preparedJob, collect artifactsOf) (*boxTarget, error) {
	t := &boxTarget{b: b, sb: sb, p: p, frame: frame, stdin: req.Spec.Stdin, prep: prep, collect: collect}
	if !req.Spec.Network.Empty() {
		ours, theirs, err := egressPair()
		if err != nil {
			return nil, err
		}
		t.egress, t.theirs = ours, theirs
		t.p.EgressPort = egressPort
	}
	return t, nil
}

func (t *boxTarget) close() {
	if t.egress != nil {
		t.egress.Close()
	}
}

func (t *boxTarget) sandbox() *sandbox { return t.sb }

func (t *boxTarget) listen(ctx context.Context) (net.Listener, error) { return t.listenFn(ctx) }

// deliver says go to the sandbox made ahead, or hands the zygote the run's
// header and parameters; then the frame and stdin go on their pipes.
func (t *boxTarget) deliver(context.Context) error {
	var err error
	if t.prep != nil {
		err = sendBoxCmd(t.sb, "g")
		t.outs = startBoxIO(t.sb, t.prep.pipes, t.frame, t.stdin)
	} else {
		t.outs, err = t.b.sendBoxJob(t.sb, t.p, t.frame, t.stdin, t.theirs)
	}
	t.theirs = nil // sent, or closed (sendBoxHeader)
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		// The zygote closed its end as it was handed the run: it ended,
		// having refused the run's header (another protocol version) or
		// crashed. watch reports its end with its last word, as for a
		// zygote that ends before reporting a run it took; the run never
		// started (undelivered).
		t.undelivered = err
		return nil
	}
	return err
}

func (t *boxTarget) started() bool { return t.rep.Ready }

// watch holds the run's lease until the zygote reports its end, and turns
// the report into how the run ended.
func (t *boxTarget) watch(ctx context.Context, lim job.Limits, e ending) (ending, error) {
	t.rep, e = t.b.superviseBox(ctx, t.sb, lim, e)
	rep := t.rep
	switch {
	case e.InitErr != nil:
	case rep.LeaseLapsed:
		// The worker did not renew its lease in time (it was stopped, or
		// starved): the run was ended so that it cannot go on beside its
		// redelivery. Retried, as the worker's fault.
		e.InitErr = errors.New("the worker's lease on the run lapsed and the box ended it")
	case rep.Killed && !e.TimedOut && !e.Canceled && !e.CPUExceeded:
		e.InitErr = fmt.Errorf("the box ended the run: %s", rep.Error)
	case !e.TimedOut && !e.Canceled && !e.CPUExceeded:
		e.Init = &initproto.Status{Ready: rep.Ready, ExitCode: rep.ExitCode, Signal: rep.Signal}
	}
	e.CPULimit = time.Duration(lim.CPUMS) * time.Millisecond
	e.InitLostWhileRunning = rep.Ready && !rep.LeaseLapsed
	t.ended = e
	return e, nil
}

// finish waits for the run's streams and output channel, reads its figures
// from the box's cgroup, and collects a job's output dir.
func (t *boxTarget) finish(ctx context.Context, res *job.Result, e *ending) (artifacts.OutputStream, time.Duration) {
	b, sb := t.b, t.sb
	t.outs.wait(b, ctx, sb)
	e.Usage = b.ct.cgroupUsage(ctx, sb)
	if t.collect == artifactsOfJob && (e.Init != nil || e.InitErr == nil) {
		sb.box.jobEnded = true
		b.hostSide.collectArtifacts(ctx, sb, res)
		sb.box.jobEnded = false
	}
	t.ended = *e
	return t.outs.outputs(), e.Usage.CPU
}

// superviseBox waits for the zygote's report on the running job, holding
// the lease (heartbeats), and ends the job at its wall clock, its CPU time
// over all its processes, or cancellation.
func (b *boxClient) superviseBox(ctx context.Context, sb *sandbox, lim job.Limits, e ending) (initproto.ZygoteReport, ending) {
	reports := make(chan initproto.ZygoteReport, 1)
	readErr := make(chan error, 1)
	go func() {
		line, err := sb.box.ctlReader.ReadBytes('\n')
		var rep initproto.ZygoteReport
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
	beat := time.NewTicker(boxHeartbeat)
	defer beat.Stop()
	meter := b.ct.newCPUMeter(sb)
	defer meter.stop()
	var killAt <-chan time.Time
	kill := func() {
		if killAt == nil {
			sendBox(sb, "k")
			killAt = time.After(boxKillGrace)
		}
	}
	done := ctx.Done()
	for {
		select {
		case rep := <-reports:
			return rep, e
		case err := <-readErr:
			// The zygote is gone: crashed, or out of memory.
			b.ct.stopTask(ctx, sb)
			e.InitErr = fmt.Errorf("the box's supervisor ended before reporting the job: %v%s", err, launcherFault(sb))
			// No job can reach the supervisor (other pid namespace, other
			// uid): its end is the platform's, unless the box's limits
			// were hit (the outcome reads the cgroup's counters).
			return initproto.ZygoteReport{}, e
		case <-sb.exitCh:
			sb.exited = true
			e.InitErr = fmt.Errorf("the box ended before reporting the job%s", launcherFault(sb))
			return initproto.ZygoteReport{}, e
		case <-beat.C:
			if !sb.box.beatsPaused.Load() {
				sendBox(sb, "h")
			}
		case <-meter.tick():
			if meter.over() {
				e.CPUExceeded = true
				kill()
			}
		case <-timer.C:
			e.TimedOut = true
			kill()
		case <-done:
			done = nil
			e.Canceled = true
			kill()
		case <-killAt:
			b.ct.stopTask(context.WithoutCancel(ctx), sb)
			e.InitErr = errors.New("the box did not end the job when asked")
			return initproto.ZygoteReport{}, e
		}
	}
}

// launcherFault is the zygote's own last word when it ended for what it
// refused ("kiln-launcher: ...", initproto.LaunchError: a header of
// another protocol version, a sandbox it could not make), for an error
// message; "" otherwise.
func launcherFault(sb *sandbox) string {
	if line := outcome.LastLine(sb.stderr.Tail()); bytes.HasPrefix(line, []byte("kiln-launcher:")) {
		return ": " + string(line)
	}
	return ""
}

// sendBox writes a one-byte command to the zygote ("h": heartbeat, "k":
// end the job). A failed write shows later as the zygote's report missing.
func sendBox(sb *sandbox, cmd string) {
	_ = sendBoxCmd(sb, cmd)
}

// sendBoxCmd writes a one-byte command to the zygote: "h", "k", or for a
// prepared sandbox "g" (its job is coming) or "x" (discard it).
func sendBoxCmd(sb *sandbox, cmd string) error {
	sb.box.ctlMu.Lock()
	defer sb.box.ctlMu.Unlock()
	_ = sb.box.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := sb.box.ctl.Write([]byte(cmd)); err != nil {
		return fmt.Errorf("sandbox: box %s: send %q: %w", sb.id, cmd, err)
	}
	return nil
}

// jobWork is one job's work dir in a box: a fresh directory on the box's
// host-side tmpfs, owned by the job's uid, bound at /work by the zygote.
type jobWork struct {
	name, dir string
	uid       int // inside the box
}

// newJobWork makes a job's work dir with its output dir, for a uid drawn at
// random (no job's uid says anything of another's), never the uid of the
// box's inner sandbox before it.
func newJobWork(sb *sandbox) (*jobWork, error) {
	uid := jobUID(sb.box.lastUID, rand.IntN)
	sb.box.lastUID = uid
	host := sb.box.base + uid
	jw := &jobWork{name: "j" + randomHex(8), uid: uid}
	jw.dir = filepath.Join(sb.workHost, "work", jw.name)
	if err := os.Mkdir(jw.dir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: box %s: job work dir: %w", sb.id, err)
	}
	out := filepath.Join(jw.dir, filepath.Base(job.OutputDir))
	for _, d := range []string{jw.dir, out} {
		if d == out {
			if err := os.Mkdir(out, 0o755); err != nil {
				return jw, fmt.Errorf("sandbox: box %s: job output dir: %w", sb.id, err)
			}
		}
		if err := os.Chown(d, host, host); err != nil {
			return jw, fmt.Errorf("sandbox: box %s: job work dir: %w", sb.id, err)
		}
	}
	return jw, nil
}

// jobUID draws a job's uid from [boxJobUIDMin, boxJobUIDMax) but last,
// every other one as likely (intN: rand.IntN).
func jobUID(last int, intN func(int) int) int {
	uid := boxJobUIDMin + intN(boxJobUIDMax-boxJobUIDMin-1)
	if last >= boxJobUIDMin && uid >= last {
		uid++
	}
	return uid
}

// remove deletes the job's work dir (every process of the job is gone;
// RemoveAll never follows a symlink, and root needs no permission bits).
func (jw *jobWork) remove(b *boxClient, ctx context.Context) {
	if jw == nil {
		return
	}
	if err := os.RemoveAll(jw.dir); err != nil {
		b.log.WarnContext(ctx, "box: remove a job's work dir", slog.String("dir", jw.dir), slog.Any("error", err))
	}
}
