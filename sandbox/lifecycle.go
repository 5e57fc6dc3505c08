package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
	ktrace "github.com/kilnrun/kiln/trace"
)

// lifecycle makes a sandbox's container and task and ends them: it
// creates, starts, feeds and measures them (here), pushes the undo step of
// each resource it takes (cleanup.go), kills a task across a containerd
// outage (outage.go), and removes a sandbox in the background and sweeps
// what this worker no longer owns (acquire.go). The facade and the box
// client call it for every sandbox they hold.
type lifecycle struct {
	cfg       Config
	client    *containerd.Client
	tracer    trace.Tracer
	log       *slog.Logger
	swapLimit bool
	hostSide  *hostSide
	live      *liveSet
	shims     *ctrd.ShimGroups
	be        *ctrd.Backend
	// life ends at Close: waits made again on tasks across a containerd
	// outage (outage.go) end with it.
	life     context.Context
	cleaning sync.WaitGroup // removals under way (retire)
}

// prepOpts is what a sandbox is created with.
type prepOpts struct {
	// jobID labels a sandbox created for one job (the cold path); "" for a
	// pooled one, labelled when its job arrives.
	jobID string
	// lim are the limits the container is created with: the job's on the
	// cold path; the policy's maxima (but the class's disk) on a pooled one,
	// lowered to the job's at arm.
	lim job.Limits
	// preload names modules the launcher imports before its job arrives.
	preload []string
	class   poolClass
	// box is the host path of a box's control socket, bound into the box
	// for its zygote and given its root's uid before the task starts; ""
	// for any other sandbox.
	box string
	// session labels a session's box with the session's id.
	session string
	// interpreter, for a session's box of a runtime with a session
	// launcher, is what the box's sessions run calls in (the runtime's own
	// launcher); the box then runs the session launcher.
	interpreter []string
}

// prepare creates and starts a sandbox for img. The launcher then blocks
// reading stdin; nothing of the job is in the container yet, so the pool
// calls this ahead of time. The returned sandbox is never nil and must be
// passed to cleanup (or retire), also on error: each resource taken here
// pushes its undo step on sb.undo as it is taken (cleanup.go).
func (c *lifecycle) prepare(ctx context.Context, img *imageEntry, o prepOpts) (*sandbox, error) {
	sb := newSandbox(img, o)
	// cctx, not ctx: sandbox.start must be the create span's sibling under
	// the caller's span, not its child.
	cctx, span := c.tracer.Start(ctx, ktrace.SpanSandboxCreate, trace.WithAttributes(
		ktrace.ContainerIDKey.String(sb.id), ktrace.ContainerImageNameKey.String(img.ref),
		ktrace.OCIManifestDigestKey.String(img.digest.String()), ktrace.JobIDKey.String(o.jobID),
		ktrace.IsolationKey.String(string(img.isolation)), ktrace.SandboxPooledKey.Bool(sb.pooled)))
	err := c.create(cctx, sb, img, o)
	endSpan(span, err)
	if err != nil {
		return sb, err
	}
	if err := ctx.Err(); err != nil {
		return sb, fmt.Errorf("sandbox: %s: %w", sb.id, context.Cause(ctx))
	}
	return sb, c.start(ctx, sb, img, o.jobID)
}

// newSandbox is the sandbox prepare makes for img, before anything is
// taken for it: its id, buffers and the limits it is created with.
func newSandbox(img *imageEntry, o prepOpts) *sandbox {
	lim := o.lim
	id := o.jobID + "-" + randomHex(2)
	if o.jobID == "" {
		id = poolIDPrefix + randomHex(8)
	}
	sb := &sandbox{id: id, jobID: o.jobID, stdout: newCappedBuffer(lim.OutputBytes), stderr: newCappedBuffer(lim.OutputBytes),
		pooled: o.jobID == "", class: o.class, img: img, prepared: time.Now(),
		armedState: armedState{cpuLimit: time.Duration(ctrd.CPULimitSeconds(lim)) * time.Second,
			memLimit: lim.MemoryMB << 20, pidsLimit: lim.Pids + extraPids(img.isolation), cpuSoft: ctrd.CPULimitSeconds(lim)}}
	if o.box != "" {
		sb.box = &boxState{}
	}
	sb.nonce = randomHex(16)
	return sb
}

// labels are the containerd labels of a sandbox prepare makes: its life's,
// never a job's but for a sandbox created for one job.
func (c *lifecycle) labels(sb *sandbox, o prepOpts) map[string]string {
	deadline := time.Now().Add(o.lim.Timeout() + ctrd.DeadlineGrace)
	labels := map[string]string{ctrd.LabelManaged: "true", ctrd.LabelWorker: c.cfg.WorkerID}
	if o.session != "" {
		labels[ctrd.LabelSession] = o.session
	}
	if sb.pooled {
		labels[ctrd.LabelPool] = o.class.runtime
		if o.box == "" {
			// A box's init ends it at lim's timeout (its
			// life); a pooled one's at its idle limit unless a job came.
			deadline = time.Now().Add(initIdleLimit + ctrd.DeadlineGrace)
		}
	} else {
		labels[ctrd.LabelJobID] = o.jobID
	}
	labels[ctrd.LabelDeadline] = strconv.FormatInt(deadline.UnixMilli(), 10)
	if c.cfg.LeaseScope != "" {
		labels[ctrd.LabelLeaseScope] = c.cfg.LeaseScope
	}
	return labels
}

// hostFiles takes what a sandbox needs on the host before its container
// exists: its place among the runtime's containers, its stdin, its uid, the
// init's status and output files, a box's control socket's ownership and its
// work dir; it returns the uid and the work dir's spec options.
func (c *lifecycle) hostFiles(sb *sandbox, img *imageEntry, o prepOpts) (int, []oci.SpecOpts, error) {
	c.live.track(sb.id, true)
	sb.undo.push(c.untrackStep(sb))
	sb.stdinR, sb.stdinW = io.Pipe()
	sb.undo.push(closeStdinStep(sb))
	uid, err := c.hostSide.sandboxUID(sb, o.box != "")
	if err != nil {
		return 0, nil, err
	}
	sb.undo.push(c.hostSide.releaseUIDStep(sb))
	// kiln-init's files are its own uid's: the supervisor's in a container
	// of its own, which the job's uid cannot open.
	initUID := c.hostSide.supervisorUID(uid, o.box != "")
	if img.isolation == IsolationGVisor {
		sb.runDir, sb.statusPath, sb.outputsPath, err = createRunDir(c.cfg.StateDir, sb.id, c.cfg.Init, initUID)
	} else {
		sb.statusPath, sb.outputsPath, err = createInitFiles(c.hostSide.workDirOf(sb.id), initUID, initUID)
	}
	sb.undo.push(c.removeInitFilesStep(sb)) // whatever part of them was made
	if o.box != "" {
		sb.outputsPath = "" // a box's jobs have a pipe of their own
	}
	if err == nil && o.box != "" {
		// Before the task starts: a zygote that connects before the
		// socket is its uid's would be refused and never connect again.
		err = os.Chown(o.box, uid, uid)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("sandbox: %s: %w", sb.id, err)
	}
	workOpts, err := c.hostSide.prepareWorkDir(sb, o.lim)
	return uid, workOpts, err
}

// create takes what the sandbox's container needs on the host (hostFiles),
// then creates the container and its task, and waits on the task's exit.
// Each resource pushes its undo step as it is taken.
func (c *lifecycle) create(ctx context.Context, sb *sandbox, img *imageEntry, o prepOpts) error {
	lim := o.lim
	uid, workOpts, err := c.hostFiles(sb, img, o)
	if err != nil {
		return err
	}
	// Creating runs to its end even when the job is canceled meanwhile: a
	// call cut short can leave the container or task created on the server
	// while the client never learns of it, and cleanup could not remove it.
	// The cancellation takes effect right after, through cleanup.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if img.isolation == IsolationRunc {
		sb.shimGroup = c.shims.Join()
		sb.undo.push(c.leaveShimGroupStep(sb))
	}
	boxBase := 0
	if sb.box != nil {
		boxBase = sb.box.base
	}
	args := img.profile.LaunchArgs(img.args, lim.MemoryMB)
	if o.interpreter != nil {
		args = slices.Clone(img.profile.SessionLauncher)
	}
	opts := append(ctrd.SpecOpts(ctrd.Profile{Args: args, Env: img.profile.Env, Limits: lim, CPUs: c.cfg.CPUs, SwapLimit: c.swapLimit,
		UID: uid, SupervisorUID: c.hostSide.supervisorUID(uid, sb.box != nil), JobPidNS: img.isolation == IsolationGVisor,
		BoxBase: boxBase, ExtraPids: extraPids(img.isolation)}),
		append(workOpts, withInit(initSetup{Binary: c.cfg.Init, Status: sb.statusPath, Nonce: sb.nonce, Timeout: lim.Timeout(), RunDir: sb.runDir, Outputs: sb.outputsPath}),
			ctrd.CaptureCgroupsPath(&sb.cgroupsPath), withPreload(o.preload), withSessionInterpreter(o.interpreter), ctrd.WithShimGroup(sb.shimGroup), ctrd.WithBoxMounts(o.box, c.hostSide.jobFilterPath(), c.cfg.Jail))...)
	ctr, err := c.client.NewContainer(dctx, sb.id,
		containerd.WithContainerLabels(c.labels(sb, o)),
		containerd.WithRuntime(plugin.RuntimeRuncV2, &runcoptions.Options{BinaryName: c.cfg.binaryFor(img.isolation)}),
		ctrd.WithRootfs(c.cfg.Snapshotter, img.rootfs, img.ref),
		containerd.WithNewSpec(opts...),
	)
	if err != nil {
		c.shims.Joined(sb.shimGroup)
		sb.joined = true
		return fmt.Errorf("sandbox: create container %s: %w", sb.id, err)
	}
	sb.container = ctr
	sb.undo.push(c.deleteContainerStep(sb))
	// FIFOs rather than a terminal: stdout and stderr stay apart, and the
	// shim copies them to our capped writers.
	stdout, stderr := outputWriters(sb)
	t, err := ctr.NewTask(dctx, cio.NewCreator(cio.WithStreams(sb.stdinR, stdout, stderr)))
	c.shims.Joined(sb.shimGroup)
	sb.joined = true
	if err != nil {
		return fmt.Errorf("sandbox: create task %s: %w", sb.id, err)
	}
	sb.task = t
	sb.undo.push(c.deleteTaskStep(sb))
	sb.undo.push(releaseJobStateStep(sb))
	if cgroups.Mode() != cgroups.Unified {
		if err := host.LimitSocketMemory(host.Cgroup1MemoryRoot, sb.cgroupsPath, lim.MemoryMB<<20); err != nil {
			return fmt.Errorf("sandbox: %s: %w", sb.id, err)
		}
	}
	// Wait before Start, so an exit that comes at once is not missed; on a
	// detached context, because the job's cancellation is handled by killing
	// the task, and the exit must still be seen after that. A wait cut off
	// by a containerd outage is made again once it answers (outage.go).
	if sb.exitCh, err = c.be.WaitExit(context.WithoutCancel(ctx), t); err != nil {
		return fmt.Errorf("sandbox: wait on task %s: %w", sb.id, err)
	}
	return nil
}

// start starts the sandbox's task (span sandbox.start), bounded like
// creating: a start that never returns (a runc stuck on the host) must not
// hold the job, or a box's class, for ever.
func (c *lifecycle) start(ctx context.Context, sb *sandbox, img *imageEntry, jobID string) error {
	sctx, span := c.tracer.Start(ctx, ktrace.SpanSandboxStart, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(jobID)))
	sctx, cancel := context.WithTimeout(sctx, startTimeout)
	defer cancel()
	if img.isolation == IsolationGVisor {
		c.raiseOOMScore(ctx, sb)
	}
	err := sb.task.Start(sctx)
	endSpan(span, err)
	if err != nil {
		return fmt.Errorf("sandbox: start task %s: %w", sb.id, err)
	}
	if img.isolation == IsolationGVisor {
		c.raiseOOMScore(ctx, sb)
	}
	return nil
}

// raiseOOMScore sets oom_score_adj 1000 on every host process in a gVisor
// sandbox's cgroup. runsc gives its sentry the spec's value only after the
// shim started it at the shim's own (1), and the ptrace platform's stub
// processes, which hold the program's address spaces, are cloned from one
// started before that: they stayed at 1, so under host memory pressure the
// kernel would pick them after the worker's neighbours. Done after create and
// again after start; later stubs are cloned from these and inherit 1000.
func (c *lifecycle) raiseOOMScore(ctx context.Context, sb *sandbox) {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err == nil {
		err = cg.SetOOMScoreAdj(ctrd.OOMScoreAdj)
	}
	if err != nil {
		c.log.WarnContext(ctx, "raise oom_score_adj of a gVisor sandbox", slog.String("container_id", sb.id), slog.Any("error", err))
	}
}

// deliver hands the job to a prepared sandbox: the frame, then the job's
// stdin, then end of file. It returns when the clock starts. Writing happens
// in the background because a program that never reads stdin would otherwise
// block it; cleanup unblocks that writer.
func (c *lifecycle) deliver(ctx context.Context, sb *sandbox, frame []byte, stdin string) (time.Time, error) {
	started := time.Now()
	go func() {
		_, err := sb.stdinW.Write(frame)
		if err == nil && stdin != "" {
			_, err = io.WriteString(sb.stdinW, stdin)
		}
		sb.stdinW.CloseWithError(err)
	}()
	// The shim holds its own end of the stdin FIFO open until told; without
	// this the launcher would never see end of file.
	if err := sb.task.CloseIO(ctx, containerd.WithStdinCloser); err != nil {
		if !ctrd.Unreachable(err) {
			return started, fmt.Errorf("sandbox: close stdin of %s: %w", sb.id, err)
		}
		// The frame went by the shim, not containerd: the job runs. Its
		// stdin ends once containerd answers again (outage.go).
		c.closeStdinLater(ctx, sb)
	}
	return started, nil
}

// shimUsage reads a finished task's figures through containerd (the cgroup
// v1 or v2 shape of the shim's metrics).
func (c *lifecycle) shimUsage(ctx context.Context, sb *sandbox) usage {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	m, err := sb.task.Metrics(mctx)
	cancel()
	var u usage
	if err == nil {
		u, err = decodeMetrics(m.Data)
	}
	if err == nil && u.PeakEstimated && host.CgroupV2() {
		if peak, ok := host.ReadMemoryPeak(host.CgroupRoot, sb.cgroupsPath); ok {
			u.MemoryPeak, u.PeakEstimated = max(u.MemoryPeak, peak), false
		}
	}
	if err != nil {
		// The run itself is sound; only its figures are missing.
		c.log.WarnContext(ctx, "sandbox metrics", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	return u
}

// outputDrainTimeout bounds the wait for a finished task's output to arrive.
// The shim closes the streams as soon as the last process in the task is
// gone, so this is reached only if something is badly wrong.
const outputDrainTimeout = 5 * time.Second

// drainOutput waits until the shim has handed over all of a finished task's
// stdout and stderr, before the task is deleted: deleting cancels the
// client's stream opens still pending, and under load that dropped the whole
// output of a program that printed and exited at once (seen about once in 500
// runs of print(1) with the CPUs busy).
func (c *lifecycle) drainOutput(ctx context.Context, sb *sandbox) {
	pio := sb.task.IO()
	if pio == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		pio.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(outputDrainTimeout):
		c.log.WarnContext(ctx, "sandbox output not drained in time; deleting the task anyway",
			slog.String("container_id", sb.id), slog.Duration("waited", outputDrainTimeout))
	}
}
