package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
)

// errUnfit is arm's answer when a pooled sandbox cannot serve a job (its
// launcher already holds more memory than the job may use): the job then
// runs on a sandbox of its own, with the same result.
var errUnfit = errors.New("the pooled sandbox cannot serve these limits")

// arm makes a prepared sandbox the job's: its output buffers and hooks, and,
// on a pooled sandbox, everything that could not be fixed before the job
// existed, from this moment on: the job id and deadline labels, the cgroup's
// memory and pids limits, RLIMIT_CPU counted from now, and the baselines the
// job's CPU time, peak memory and OOM kills are read against. Nothing of the
// job is in the sandbox yet; the launcher is blocked reading its stdin.
func (x *executor) arm(ctx context.Context, sb *sandbox, req Request, lim job.Limits) error {
	jobID := req.ID
	sb.jobID = jobID
	sb.hooks = hooksOf(req)
	sb.cpuBudget = time.Duration(lim.CPUMS) * time.Millisecond
	// Anything the launcher printed before its job (a preloaded module's
	// warning) is not the job's output.
	sb.stdout.reset(lim.OutputBytes)
	sb.stderr.reset(lim.OutputBytes)
	if h := sb.hooks.Output; h != nil {
		sb.tap.Store(&h)
	}
	if !sb.pooled {
		return nil
	}
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	mem := lim.MemoryMB << 20
	used, err := cg.MemoryUsage()
	if err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	// The job's limit is its own: what it allocates beyond what the
	// sandbox held once it had preloaded (the pages a box's jobs share
	// with its zygote).
	mem += sb.baseline
	used = max(used-sb.baseline, 0)
	// Lowering the limit below what is charged would make the kernel
	// reclaim or OOM-kill the launcher before the job began. A session's
	// box holds what its calls kept under the same limit: it is the
	// session's, not a launcher's.
	if used > (lim.MemoryMB<<20)*9/10 && (sb.box == nil || !sb.box.session) {
		return fmt.Errorf("sandbox: arm %s: %w: %d MB in use, limit %d MB", sb.id, errUnfit, used>>20, lim.MemoryMB)
	}
	if sb.box == nil {
		// The labels are for reaping after a worker's death (ReapJob,
		// ReapExpired), not for the job: written beside it, off its path.
		// A box keeps the labels of its whole life (pool, worker,
		// deadline), which is what reaping it then needs.
		x.labelJob(ctx, sb, jobID, lim)
	}
	if err := armLimits(cg, sb, lim.Pids, mem, x.swapLimit); err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	if sb.peakFile != nil { // a box's previous job's
		sb.peakFile.Close()
	}
	if sb.peakFile, err = cg.ResetPeak(); err != nil {
		return fmt.Errorf("sandbox: arm %s: reset memory peak: %w", sb.id, err)
	}
	if sb.cpuBase, err = cg.CPUUsage(); err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	if sb.oomBase, err = cg.OOMKills(); err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	if sb.box != nil {
		// The zygote sets the job's own process's limit, from zero, and
		// the worker watches the job's CPU time over all its processes.
		sb.cpuLimit = time.Duration(ctrd.CPULimitSeconds(lim)) * time.Second
		return nil
	}
	limit, err := armCPULimit(ctx, sb, cg, lim)
	if err != nil {
		return fmt.Errorf("sandbox: arm %s: %w", sb.id, err)
	}
	sb.cpuLimit = limit
	return nil
}

// armLimits writes the pids and memory limits of a prepared sandbox's
// cgroup, only what differs from the limits in force: lowering a v1 memory
// limit drains every CPU's charge cache, milliseconds a job.
func armLimits(cg host.CgroupDir, sb *sandbox, pids, mem int64, swapLimit bool) error {
	if pids := pids + extraPids(sb.img.isolation); pids != sb.pidsLimit {
		if err := cg.SetPidsLimit(pids); err != nil {
			return err
		}
		sb.pidsLimit = pids
	}
	if mem == sb.memLimit {
		return nil
	}
	if err := cg.SetMemoryLimit(mem, swapLimit); err != nil {
		return err
	}
	if !cg.V2() {
		if err := host.LimitSocketMemory(host.Cgroup1MemoryRoot, sb.cgroupsPath, mem); err != nil {
			return err
		}
	}
	sb.memLimit = mem
	return nil
}

// labelJob writes a pooled sandbox's job id and deadline labels in the
// background; cleanup waits for it (sb.labelled).
func (x *executor) labelJob(ctx context.Context, sb *sandbox, jobID string, lim job.Limits) {
	labels := map[string]string{ctrd.LabelJobID: jobID,
		ctrd.LabelDeadline: strconv.FormatInt(time.Now().Add(lim.Timeout()+ctrd.DeadlineGrace).UnixMilli(), 10)}
	done := make(chan struct{})
	sb.labelled = done
	go func() {
		defer close(done)
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, err := sb.container.SetLabels(lctx, labels); err != nil {
			x.log.WarnContext(lctx, "label a pooled sandbox with its job", slog.String("container_id", sb.id), slog.String("job_id", jobID), slog.Any("error", err))
		}
	}()
}

// armCPULimit lowers RLIMIT_CPU of every process in the sandbox but its
// init (the launcher, normally alone) to the job's budget on top of what the
// process has already used (preloading), rounded up to whole seconds as on
// the cold path, with the hard limit a second later. The processes are
// blocked on their stdin and cannot raise it back (no CAP_SYS_RESOURCE).
// It returns the largest soft limit set.
func armCPULimit(ctx context.Context, sb *sandbox, cg host.CgroupDir, lim job.Limits) (time.Duration, error) {
	pids, err := cg.Procs()
	if err != nil {
		return 0, err
	}
	initPid := int(sb.task.Pid())
	budget := time.Duration(lim.CPUMS) * time.Millisecond
	var limit time.Duration
	n := 0
	for _, pid := range pids {
		if pid == initPid {
			continue
		}
		used, err := host.ProcessCPU(pid)
		if err != nil {
			return 0, err
		}
		soft := uint64((used + budget + time.Second - 1) / time.Second)
		if soft != sb.cpuSoft {
			if err := host.SetCPULimit(ctx, pid, sb.uid, soft); err != nil {
				// Raising the hard limit needs CAP_SYS_RESOURCE; without
				// it the job runs on a sandbox created for it.
				return 0, fmt.Errorf("%w: %w", errUnfit, err)
			}
		}
		limit = max(limit, time.Duration(soft)*time.Second)
		n++
	}
	if n == 0 {
		return 0, fmt.Errorf("no launcher process in the sandbox")
	}
	sb.cpuSoft = uint64(limit / time.Second)
	return limit, nil
}
