package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/containerd/containerd"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/artifacts"
	"github.com/kilnrun/kiln/sandbox/host"
)

// containerTarget is a run in a container of its own (fresh, or prepared
// ahead by the pool): kiln-init is its pid 1, reads the frame from stdin,
// and reports how the launcher ended in a status file the job cannot forge.
type containerTarget struct {
	r     *Containerd
	sb    *sandbox
	frame []byte
	stdin string
}

func (t *containerTarget) sandbox() *sandbox { return t.sb }

// listen makes the listener in the container's network namespace, from a
// thread that enters it for the call.
func (t *containerTarget) listen(context.Context) (net.Listener, error) {
	return listenInNetns(t.sb.task.Pid())
}

func (t *containerTarget) deliver(ctx context.Context) error {
	_, err := t.r.ct.deliver(ctx, t.sb, t.frame, t.stdin)
	return err
}

func (t *containerTarget) started() bool { return true }

// watch waits for the task to exit, killing every process in it when the
// wall-clock limit passes, its CPU time over all its processes passes its
// limit, or ctx ends; then reads kiln-init's status.
func (t *containerTarget) watch(ctx context.Context, _ job.Limits, e ending) (ending, error) {
	r, sb := t.r, t.sb
	timer := time.NewTimer(e.Timeout)
	defer timer.Stop()
	meter := r.ct.newCPUMeter(sb)
	defer meter.stop()
	var st containerd.ExitStatus
wait:
	for {
		select {
		case st = <-sb.exitCh:
		case <-timer.C:
			if initReported(sb) {
				// The job ended within its limit; only its exit is late
				// (containerd is away, outage.go).
				continue
			}
			e.TimedOut = true
		case <-ctx.Done():
			e.Canceled = true
		case <-meter.tick():
			if !meter.over() {
				continue
			}
			e.CPUExceeded = true
		}
		break wait
	}
	if e.TimedOut || e.Canceled || e.CPUExceeded {
		var err error
		if st, err = r.ct.killAndWait(ctx, sb); err != nil {
			return e, err
		}
	}
	code, _, err := st.Result()
	if err != nil {
		return e, fmt.Errorf("sandbox: wait for task %s: %w", sb.id, err)
	}
	sb.exited = true
	e.TaskExit = code
	if !e.TimedOut && !e.Canceled {
		if st, err := readStatus(sb.statusPath, sb.nonce); err == nil {
			e.Init = &st
		} else {
			e.InitErr = err
			r.log.WarnContext(ctx, "sandbox ended without its init's status", slog.String("container_id", sb.id),
				slog.String("isolation", string(sb.img.isolation)), slog.Int("task_exit", int(e.TaskExit)), slog.Any("error", err))
		}
	}
	e.CPULimit = sb.cpuLimit
	if e.CPUExceeded {
		// The watcher ended it: the limit it held was the job's own, not
		// RLIMIT_CPU's whole seconds.
		e.CPULimit = sb.cpuBudget
	}
	return e, nil
}

// finish reads the cgroup's figures (before the task is deleted: deleting
// it removes the cgroup), collects the artifacts and the output channel's
// file, and retires the sandbox.
func (t *containerTarget) finish(ctx context.Context, res *job.Result, e *ending) (artifacts.OutputStream, time.Duration) {
	r, sb := t.r, t.sb
	var jobCPU time.Duration
	if sb.pooled {
		// The cgroup counted the launcher's start-up before the job: the
		// job's CPU time, peak and OOM kills are what came after arm. The
		// judgement of the CPU limit keeps the whole count, as RLIMIT_CPU
		// does.
		e.Usage = r.ct.cgroupUsage(ctx, sb)
		jobCPU = e.Usage.CPU
		e.Usage.CPU += sb.cpuBase
	} else {
		e.Usage = r.ct.shimUsage(ctx, sb)
		jobCPU = e.Usage.CPU
	}
	if e.Init == nil && !e.TimedOut && !e.Canceled {
		// No report from kiln-init, and the runtime did not end the task:
		// whether the job had exhausted its limits decides whose failure it
		// was (gVisor's kernel runs in the job's cgroup and can die of it).
		if cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath); err == nil {
			var herr error
			e.Usage.PidsLimitHits, e.Usage.MemoryLimitHits, herr = cg.LimitsHit()
			if herr != nil {
				r.log.WarnContext(ctx, "sandbox limit counters", slog.String("container_id", sb.id), slog.Any("error", herr))
			}
		}
	}
	r.ct.drainOutput(ctx, sb)
	r.hostSide.collectArtifacts(ctx, sb, res)
	var outs artifacts.OutputStream
	if sb.exited {
		var err error
		if outs, err = artifacts.ReadOutputsFile(sb.outputsPath); err != nil {
			r.log.WarnContext(ctx, "sandbox output channel", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	r.ct.retire(ctx, sb)
	return outs, jobCPU
}

// runInContainer runs a planned job in a container of its own: taken from
// the pool, or created for it.
func (r *Containerd) runInContainer(ctx context.Context, pl plan, res job.Result) (job.Result, error) {
	sb, err := r.acquire(ctx, pl.req, pl.img, pl.lim)
	if err != nil {
		return failed(ctx, res, createError{err})
	}
	// A sandbox that ended on an error path is removed here; finish retires
	// the others itself, after their figures are read.
	defer r.ct.retire(ctx, sb)
	t := &containerTarget{r: r, sb: sb, frame: pl.frame, stdin: pl.req.Spec.Stdin}
	out, err := r.exec.execute(ctx, t, pl.req, pl.lim, res, r.exec.endingFor(ctx, pl.req.Spec.Runtime, pl.img, pl.lim))
	if err != nil {
		return failed(ctx, out, err)
	}
	return out, nil
}
