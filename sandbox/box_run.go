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
	"time"

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

// runBox runs one job in a fresh inner sandbox of box sb and returns the
// box to its tenant's idle set, or retires it after any anomaly.
func (r *Containerd) runBox(ctx context.Context, sb *sandbox, key boxKey, req Request, lim job.Limits, res job.Result,
	e ending) (job.Result, error) {
	id, spec := req.ID, req.Spec
	markPooled(ctx, true)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(ktrace.SandboxBoxKey.Bool(true), ktrace.ContainerImageNameKey.String(sb.img.ref),
		ktrace.OCIManifestDigestKey.String(sb.img.digest.String()), ktrace.ContainerIDKey.String(sb.id))
	keep := false
	var next *boxParams // what the box's next sandbox is made of, once known
	defer func() {
		sb.box.lastUsed = r.boxes.cfg.Now()
		if keep && next != nil {
			if err := r.prepareNext(ctx, sb, *next); err != nil {
				r.log.WarnContext(ctx, "box retired: its next sandbox could not be prepared", slog.String("container_id", sb.id), slog.Any("error", err))
				keep = false
			}
		}
		if keep && r.boxes.put(key, sb) {
			return
		}
		r.retireBox(ctx, sb)
		if !errors.Is(ctx.Err(), context.Canceled) {
			r.boxes.grow(ctx, key.class, sb.img)
		}
	}()
	if err := r.arm(ctx, sb, req, lim); err != nil {
		// A job whose memory limit is below what the zygote holds runs in
		// a container of its own; the box waits for the next job.
		keep = errors.Is(err, errUnfit)
		return res, fmt.Errorf("sandbox: box %s: %w", sb.id, err)
	}
	p := boxParams{CPUS: cpuLimitSeconds(lim), FSize: lim.DiskMB << 20, NoFile: openFilesLimit,
		TmpMB: lim.DiskMB, RMem: "4096 131072 " + socketBufferMax, WMem: "4096 16384 " + socketBufferMax}
	// A network job's proxy listener is made in its sandbox's namespace
	// as the sandbox is made: it never takes a prepared one.
	prep, err := r.takePrepared(ctx, sb, p, !spec.Network.Empty())
	if err != nil {
		return res, err
	}
	var jw *jobWork
	if prep != nil {
		jw = prep.jw
	} else if jw, err = newJobWork(sb); err != nil {
		jw.remove(r, ctx)
		return res, err
	}
	defer jw.remove(r, ctx)
	sb.box.jobDir = jw.dir
	defer func() { sb.box.jobDir = "" }()
	r.running.Store(id, sb)
	defer r.running.Delete(id)
	frame, err := encodeFrame(spec)
	if err != nil {
		return res, err
	}
	nextP := p // before the uid and work dir are the job's
	next = &nextP
	p.UID, p.Work = jw.uid, jw.name
	wctx, wspan := r.tracer.Start(ctx, ktrace.SpanSandboxWait, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(id)))
	defer wspan.End()
	var egress *egressRun
	var egressEnd *os.File
	if !spec.Network.Empty() {
		ours, theirs, err := egressPair()
		if err != nil {
			return res, err
		}
		defer ours.Close()
		p.EgressPort, egressEnd = egressPort, theirs
		egress = serveEgress(ctx, req.Net(), func(ctx context.Context) (net.Listener, error) { return receiveListener(ctx, ours) })
		defer egress.finish()
	}
	var outs *jobOutput
	if prep != nil {
		err = r.sendBoxCmd(sb, "g")
		outs = startBoxIO(sb, prep.pipes, frame, spec.Stdin)
	} else {
		outs, err = r.sendBoxJob(sb, p, frame, spec.Stdin, egressEnd)
	}
	if err != nil {
		endSpan(wspan, err)
		return res, err
	}
	started := time.Now()
	rep, e := r.superviseBox(wctx, sb, lim, e)
	res.WallMS = time.Since(started).Milliseconds()
	if egress != nil {
		var eerr error
		if res.Egress, eerr = egress.finish(); eerr != nil && rep.Ready {
			r.log.WarnContext(ctx, "the job's egress proxy did not start", slog.String("container_id", sb.id), slog.Any("error", eerr))
		}
	}
	outs.wait(r, ctx, sb)
	e.Usage = r.cgroupUsage(ctx, sb)
	switch {
	case e.InitErr != nil:
	case rep.LeaseLapsed:
		// The worker did not renew its lease in time (it was stopped, or
		// starved): the job was ended so that it cannot run on beside its
		// redelivery. Retried, as the worker's fault.
		e.InitErr = errors.New("the worker's lease on the job lapsed and the box ended it")
	case rep.Killed && !e.TimedOut && !e.Canceled && !e.CPUExceeded:
		e.InitErr = fmt.Errorf("the box ended the job: %s", rep.Error)
	case !e.TimedOut && !e.Canceled && !e.CPUExceeded:
		e.Init = &initproto.Status{Ready: rep.Ready, ExitCode: rep.ExitCode, Signal: rep.Signal}
	}
	if e.Init != nil || e.InitErr == nil {
		sb.box.jobEnded = true
		r.collectArtifacts(ctx, sb, &res)
		sb.box.jobEnded = false
	}
	channel := outs.outputs()
	artifacts.PlaceOutputs(ctx, sb.hooks.Store, &res, channel)
	sb.box.jobs++
	keep = e.InitErr == nil && rep.Clean && !rep.LeaseLapsed && sb.box.jobs < r.boxes.cfg.MaxJobs &&
		r.boxes.cfg.Now().Sub(sb.prepared) < r.boxes.cfg.MaxAge && r.onlySupervisor(sb)
	if !rep.Clean && rep.Error != "" {
		r.log.WarnContext(ctx, "box retired", slog.String("container_id", sb.id), slog.String("error", rep.Error))
	}
	e.CPULimit = time.Duration(lim.CPUMS) * time.Millisecond
	e.InitLostWhileRunning = rep.Ready && !rep.LeaseLapsed
	result := judge(wspan, sb, res, e, e.Usage.CPU)
	artifacts.AttachException(&result, channel)
	return result, nil
}

// superviseBox waits for the zygote's report on the running job, holding
// the lease (heartbeats), and ends the job at its wall clock, its CPU time
// over all its processes, or cancellation.
func (r *Containerd) superviseBox(ctx context.Context, sb *sandbox, lim job.Limits, e ending) (initproto.ZygoteReport, ending) {
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
	meter := r.newCPUMeter(sb)
	defer meter.stop()
	var killAt <-chan time.Time
	kill := func() {
		if killAt == nil {
			r.sendBox(sb, "k")
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
			r.stopTask(ctx, sb)
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
				r.sendBox(sb, "h")
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
			r.stopTask(context.WithoutCancel(ctx), sb)
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
func (r *Containerd) sendBox(sb *sandbox, cmd string) {
	_ = r.sendBoxCmd(sb, cmd)
}

// sendBoxCmd writes a one-byte command to the zygote: "h", "k", or for a
// prepared sandbox "g" (its job is coming) or "x" (discard it).
func (r *Containerd) sendBoxCmd(sb *sandbox, cmd string) error {
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
func (jw *jobWork) remove(r *Containerd, ctx context.Context) {
	if jw == nil {
		return
	}
	if err := os.RemoveAll(jw.dir); err != nil {
		r.log.WarnContext(ctx, "box: remove a job's work dir", slog.String("dir", jw.dir), slog.Any("error", err))
	}
}
