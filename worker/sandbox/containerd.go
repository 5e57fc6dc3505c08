package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Labels on every container and snapshot the runtime creates.
const (
	LabelManaged = "kiln.managed" // "true"
	LabelJobID   = "kiln.job.id"
	LabelWorker  = "kiln.worker"
	// LabelRootfs marks an image's shared read-only root view; its value is
	// the image's layer chain id.
	LabelRootfs = "kiln.rootfs"
	// LabelDeadline is when the sandbox has outlived its wall-clock limit
	// (Unix milliseconds): any worker on the host removes it after that,
	// whether or not its own worker is still there (ReapExpired).
	LabelDeadline = "kiln.deadline"
	// LabelLeaseScope names the store whose worker leases decide whether
	// the sandbox's worker is gone (Config.LeaseScope).
	LabelLeaseScope = "kiln.lease-scope"
)

// cleanupTimeout bounds kill, metrics and delete calls, which run on a
// context detached from the job's so they survive its cancellation.
const cleanupTimeout = 30 * time.Second

// Containerd is the Runtime backed by a containerd daemon and runc.
type Containerd struct {
	cfg       Config
	client    *containerd.Client
	tracer    trace.Tracer
	log       *slog.Logger
	swapLimit bool
	uids      *uidPool

	mu     sync.Mutex
	images map[string]*imageEntry // by runtime and reference (imageKey)
}

var _ Runtime = (*Containerd)(nil)

// imageEntry is what a run needs from an image, resolved once per digest so
// that a job does not re-read the manifest and config from the content store.
type imageEntry struct {
	ref     string
	digest  digest.Digest
	chainID string   // the image's unpacked layer chain
	rootfs  string   // the key of the chain's shared read-only view, every job's root
	args    []string // entrypoint + cmd: the launcher
	profile RuntimeProfile
	pkgs    imagePackages
	// isolation is what the runtime's sandboxes run under (Config.isolationOf).
	isolation Isolation
}

// New connects to containerd. It does not touch images; the first Run or
// Image call resolves (and if needed unpacks) them.
func New(ctx context.Context, cfg Config) (*Containerd, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bins := []struct{ path, fix string }{
		{cfg.Runc, "install the pinned release with deploy/local/runc.sh or `make deps`"},
		{cfg.Init, "build and install it with `make init`"},
	}
	if cfg.usesGVisor() {
		bins = append(bins, struct{ path, fix string }{cfg.Runsc, "install runsc and its wrapper with deploy/local/runsc.sh or `make deps`"})
	}
	for _, b := range bins {
		if st, err := os.Stat(b.path); err != nil || st.Mode()&0o111 == 0 || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("sandbox: %s is missing or not executable (%s): %v", b.path, b.fix, err)
		}
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("sandbox: connect to containerd at %s: %w", cfg.Address, err)
	}
	logContainerdVersion(ctx, client, cfg.Logger)
	return &Containerd{
		cfg:       cfg,
		client:    client,
		tracer:    cfg.TracerProvider.Tracer("github.com/kilnrun/kiln/worker/sandbox"),
		log:       cfg.Logger,
		swapLimit: swapAccounted(),
		uids:      newUIDPool(cfg.UIDStart, cfg.UIDCount, cfg.UIDLockDir),
		images:    map[string]*imageEntry{},
	}, nil
}

// swapAccounted reports whether a memory+swap limit can be set. cgroup v2:
// runc turns memory+swap into memory.swap.max and tolerates a host without
// swap accounting. cgroup v1: runc fails the container when memsw files are
// missing (kernel booted without swapaccount), so the limit is left out there
// and memory alone is limited.
func swapAccounted() bool {
	if cgroups.Mode() == cgroups.Unified {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// Runtimes lists the configured runtime names, sorted.
func (r *Containerd) Runtimes() []string {
	names := make([]string, 0, len(r.cfg.Images))
	for n := range r.cfg.Images {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Close closes the connection to containerd.
func (r *Containerd) Close() error { return r.client.Close() }

// Image returns the runtime's image name and manifest digest as containerd has it now.
func (r *Containerd) Image(ctx context.Context, runtime string) (job.Image, error) {
	if err := job.ValidateRuntime(runtime, r.Runtimes()); err != nil {
		return job.Image{}, fmt.Errorf("sandbox: %w", err)
	}
	img, err := r.resolve(namespaces.WithNamespace(ctx, r.cfg.Namespace), runtime)
	if err != nil {
		return job.Image{}, err
	}
	return job.Image{Name: img.ref, Digest: img.digest.String()}, nil
}

// resolve looks the runtime's image up (one cheap metadata call, so a rebuilt
// image is picked up by the next job) and reuses the parsed entry while the
// digest is unchanged.
func (r *Containerd) resolve(ctx context.Context, runtime string) (*imageEntry, error) {
	ref := r.cfg.Images[runtime]
	rec, err := r.client.ImageService().Get(ctx, ref)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox: image %s for runtime %s is not in containerd namespace %s (build it with `make image`): %w", ref, runtime, r.cfg.Namespace, err)
		}
		return nil, fmt.Errorf("sandbox: get image %s: %w", ref, err)
	}
	// Keyed by runtime too: two runtimes may share an image and differ in isolation.
	key := imageKey(runtime, ref)
	r.mu.Lock()
	e := r.images[key]
	r.mu.Unlock()
	if e != nil && e.digest == rec.Target.Digest {
		return e, nil
	}
	// One read of the manifest and config gives the launcher command and the
	// layer chain. (IsUnpacked, Spec and RootFS would read both blobs three times.)
	img := containerd.NewImage(r.client, rec)
	ic, err := img.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read image config of %s: %w", ref, err)
	}
	args := append(slices.Clone(ic.Config.Entrypoint), ic.Config.Cmd...)
	if len(args) == 0 {
		return nil, fmt.Errorf("sandbox: image %s has no entrypoint; it must start the kiln launcher", ref)
	}
	profile, err := parseProfile(ic.Config.Labels[LabelProfile])
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s (label %s; rebuild it with `make image RUNTIME=%s`): %w", ref, LabelProfile, runtime, err)
	}
	pkgs, err := parsePackages(ic.Config.Labels[LabelPackages])
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s (label %s): %w", ref, LabelPackages, err)
	}
	iso, err := r.cfg.isolationOf(runtime, profile)
	if err != nil {
		return nil, fmt.Errorf("sandbox: runtime %s: %w", runtime, err)
	}
	if iso == IsolationGVisor {
		if st, err := os.Stat(r.cfg.Runsc); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("sandbox: runtime %s runs under gvisor but %s is missing or not executable (install it with deploy/local/runsc.sh or `make deps`): %v", runtime, r.cfg.Runsc, err)
		}
	}
	chainID := identity.ChainID(ic.RootFS.DiffIDs).String()
	rootfs, err := r.ensureRootfs(ctx, img, chainID)
	if err != nil {
		return nil, fmt.Errorf("sandbox: image %s: %w", ref, err)
	}
	old := e
	e = &imageEntry{ref: ref, digest: rec.Target.Digest, chainID: chainID, rootfs: rootfs, args: args, profile: profile, pkgs: pkgs, isolation: iso}
	r.mu.Lock()
	r.images[key] = e
	r.mu.Unlock()
	if old != nil && old.rootfs != rootfs {
		// The image was rebuilt: its old root view may now be unused.
		if _, err := r.pruneRootfs(ctx); err != nil {
			r.log.WarnContext(ctx, "prune root views of replaced images", slog.Any("error", err))
		}
	}
	return e, nil
}

// imageKey is Containerd.images' key of a runtime's image entry.
func imageKey(runtime, ref string) string { return runtime + " " + ref }

// rootfsKey names the shared read-only view of a layer chain.
func rootfsKey(chainID string) string {
	return "kiln-rootfs-" + strings.TrimPrefix(chainID, "sha256:")
}

// ensureRootfs returns the key of the chain's shared read-only view,
// unpacking the image and creating the view when missing. Every job's
// container mounts this one view (its root is read-only, so nothing is
// written to it), which spares each job a snapshot of its own to create and
// remove. The view is a GC root, so containerd keeps it (and the image layers
// under it) while no container uses it; pruneRootfs removes it once no image
// has the chain any more.
func (r *Containerd) ensureRootfs(ctx context.Context, img containerd.Image, chainID string) (string, error) {
	key := rootfsKey(chainID)
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	// The view's existence implies the layers under it are unpacked.
	_, err := sn.Stat(ctx, key)
	if err == nil {
		return key, nil
	}
	if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("look up root view %s: %w", key, err)
	}
	if _, err := sn.Stat(ctx, chainID); errdefs.IsNotFound(err) {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return "", fmt.Errorf("unpack: %w", err)
		}
	} else if err != nil {
		return "", fmt.Errorf("check it is unpacked: %w", err)
	}
	labels := map[string]string{
		LabelManaged: "true", LabelRootfs: chainID,
		"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339),
	}
	// Another worker on the host may create it at the same moment: fine.
	if _, err := sn.View(ctx, key, chainID, snapshots.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		return "", fmt.Errorf("create root view %s: %w", key, err)
	}
	return key, nil
}

// pruneRootfs removes the shared root views whose chain no image in the
// namespace has any more (the image was rebuilt or removed) and that no
// container mounts. It returns how many it removed.
func (r *Containerd) pruneRootfs(ctx context.Context) (int, error) {
	keep := map[string]bool{}
	imgs, err := r.client.ListImages(ctx)
	if err != nil {
		return 0, fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		diffs, err := img.RootFS(ctx)
		if err != nil {
			// An image we cannot read might be the one a view belongs to.
			return 0, fmt.Errorf("read layers of image %s: %w", img.Name(), err)
		}
		keep[rootfsKey(identity.ChainID(diffs).String())] = true
	}
	cs, err := r.client.ContainerService().List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		keep[c.SnapshotKey] = true
	}
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	var stale []string
	err = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Labels[LabelRootfs] != "" && !keep[info.Name] {
			stale = append(stale, info.Name)
		}
		return nil
	}, fmt.Sprintf("labels.%q==true", LabelManaged))
	if err != nil {
		return 0, fmt.Errorf("list root views: %w", err)
	}
	n := 0
	var errs []error
	for _, key := range stale {
		// A job that resolved the old image a moment ago and mounts the view
		// now fails to start and is retried on the current image.
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove root view %s: %w", key, err))
			continue
		}
		n++
		r.log.InfoContext(ctx, "removed the root view of an image no longer present", slog.String("snapshot", key))
	}
	return n, errors.Join(errs...)
}

// Run runs one job; see Runtime.
func (r *Containerd) Run(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
	res := job.Result{ID: id}
	spec.Normalize()
	lim, frame, err := r.check(id, spec)
	if err != nil {
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return res, fmt.Errorf("sandbox: job %s: %w", id, err)
	}
	res.Limits = &lim
	fail := func(err error) (job.Result, error) {
		if ctx.Err() != nil {
			// The fault is the cancellation, not the platform.
			res.Status, res.Error = job.StatusCanceled, job.NewFailure(job.CategoryCanceled, "canceled before the program finished")
			return res, nil
		}
		res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, err.Error())
		return res, err
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)

	img, err := r.resolve(ctx, spec.Runtime)
	if err != nil {
		return fail(err)
	}
	res.Image = job.Image{Name: img.ref, Digest: img.digest.String()}
	if err := spec.ValidateFor(img.profile.contract(img.pkgs)); err != nil {
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return res, fmt.Errorf("sandbox: job %s: %w", id, err)
	}

	sb, err := r.prepare(ctx, id, img, lim)
	defer r.cleanup(ctx, sb)
	if err != nil {
		return fail(createError{err})
	}
	started, err := r.deliver(ctx, sb, frame, spec.Stdin)
	if err != nil {
		return fail(err)
	}
	end, err := r.wait(ctx, sb, lim.Timeout())
	res.WallMS = time.Since(started).Milliseconds()
	if err != nil {
		return fail(err)
	}
	if !end.TimedOut && !end.Canceled {
		if st, err := readStatus(sb.statusPath, sb.nonce); err == nil {
			end.Init = &st
		} else {
			end.InitErr = err
			r.log.WarnContext(ctx, "sandbox ended without its init's status", slog.String("container_id", sb.id),
				slog.String("isolation", string(img.isolation)), slog.Int("task_exit", int(end.TaskExit)), slog.Any("error", err))
		}
	}
	end.Timeout, end.MemoryLimit, end.Runtime, end.ImageName = lim.Timeout(), lim.MemoryMB<<20, spec.Runtime, img.ref
	end.Classifier, end.HasModule = classifiers[img.profile.Classifier], r.hasModule(ctx, spec.Runtime)
	end.CPULimit = time.Duration(cpuLimitSeconds(lim)) * time.Second
	return r.collect(ctx, sb, res, end), nil
}

// check validates everything about a job before anything is created.
func (r *Containerd) check(id string, spec job.Spec) (job.Limits, []byte, error) {
	if err := spec.Validate(); err != nil {
		return job.Limits{}, nil, err
	}
	if err := job.ValidateRuntime(spec.Runtime, r.Runtimes()); err != nil {
		return job.Limits{}, nil, err
	}
	lim, err := r.cfg.Policy.Resolve(spec.Limits)
	if err != nil {
		return job.Limits{}, nil, err
	}
	if err := spec.FitsLimits(lim); err != nil {
		return job.Limits{}, nil, err
	}
	if err := identifiers.Validate(id + "-0000"); err != nil {
		return job.Limits{}, nil, &job.InvalidError{Field: "id", Message: fmt.Sprintf("job id %q cannot name a container: %v", id, err)}
	}
	frame, err := encodeFrame(spec)
	if err != nil {
		return job.Limits{}, nil, err
	}
	return lim, frame, nil
}

// sandbox is one prepared container: created, started, its launcher waiting
// on stdin for the job frame.
type sandbox struct {
	id        string
	jobID     string
	container containerd.Container
	task      containerd.Task
	exitCh    <-chan containerd.ExitStatus
	stdinR    *io.PipeReader
	stdinW    *io.PipeWriter
	stdout    *cappedBuffer
	stderr    *cappedBuffer
	cleaned   bool
	// exited is set once the task's init process was seen to exit. Its pid
	// namespace dies with it (the kernel kills and reaps every process left
	// in it before init's exit is reported), so nothing is left to kill.
	exited bool
	// cgroupsPath is the container's cgroup as the spec names it, for
	// figures the shim's metrics lack (memory.peak on cgroup v2).
	cgroupsPath string
	// statusPath is the host file kiln-init reports in; nonce is the
	// secret its report must carry.
	statusPath string
	nonce      string
	// runDir is the host directory mounted at /run under gVisor
	// (createRunDir); "" under runc.
	runDir string
	// uid is the sandbox's host uid from the pool; 0 when none was taken.
	uid int
	// workHost is the host dir holding the work dir tmpfs ("" until mounted).
	workHost string
	hooks    Hooks
}

// prepare creates and starts a sandbox for img with lim. The launcher then
// blocks reading stdin; nothing of the job is in the container yet, so a
// later warm pool can call this ahead of time. The returned sandbox is never
// nil and must be passed to cleanup, also on error.
func (r *Containerd) prepare(ctx context.Context, jobID string, img *imageEntry, lim job.Limits) (*sandbox, error) {
	sb := &sandbox{id: jobID + "-" + randomHex(2), jobID: jobID, stdout: newCappedBuffer(lim.OutputBytes), stderr: newCappedBuffer(lim.OutputBytes),
		hooks: hooksFrom(ctx)}
	sb.stdinR, sb.stdinW = io.Pipe()

	// cctx, not ctx: sandbox.start must be the create span's sibling under
	// the caller's span, not its child.
	cctx, span := r.tracer.Start(ctx, ktrace.SpanSandboxCreate, trace.WithAttributes(
		ktrace.ContainerIDKey.String(sb.id), ktrace.ContainerImageNameKey.String(img.ref),
		ktrace.OCIManifestDigestKey.String(img.digest.String()), ktrace.JobIDKey.String(jobID),
		ktrace.IsolationKey.String(string(img.isolation))))
	labels := map[string]string{LabelManaged: "true", LabelJobID: jobID, LabelWorker: r.cfg.WorkerID,
		LabelDeadline: strconv.FormatInt(time.Now().Add(lim.Timeout()+DeadlineGrace).UnixMilli(), 10)}
	if r.cfg.LeaseScope != "" {
		labels[LabelLeaseScope] = r.cfg.LeaseScope
	}
	sb.nonce = randomHex(16)
	uid, err := r.uids.acquire()
	if err != nil {
		endSpan(span, err)
		return sb, err
	}
	sb.uid = uid
	if img.isolation == IsolationGVisor {
		sb.runDir, sb.statusPath, err = createRunDir(r.cfg.StateDir, sb.id, r.cfg.Init, uid)
	} else {
		sb.statusPath, err = createStatusFile(r.cfg.StateDir, sb.id, uid, uid)
	}
	if err != nil {
		endSpan(span, err)
		return sb, fmt.Errorf("sandbox: %s: %w", sb.id, err)
	}
	workOpts, err := r.prepareWorkDir(sb, lim)
	if err != nil {
		endSpan(span, err)
		return sb, err
	}
	// Creating runs to its end even when the job is canceled meanwhile: a
	// call cut short can leave the container or task created on the server
	// while the client never learns of it, and cleanup could not remove it.
	// The cancellation takes effect right after, through cleanup.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(cctx), cleanupTimeout)
	defer cancel()
	c, err := r.client.NewContainer(dctx, sb.id,
		containerd.WithContainerLabels(labels),
		containerd.WithRuntime(plugin.RuntimeRuncV2, &runcoptions.Options{BinaryName: r.cfg.binaryFor(img.isolation)}),
		withRootfs(r.cfg.Snapshotter, img.rootfs, img.ref),
		containerd.WithNewSpec(append(specOpts(profile{Args: img.profile.launchArgs(img.args, lim.MemoryMB), Env: img.profile.Env, Limits: lim, CPUs: r.cfg.CPUs, SwapLimit: r.swapLimit, UID: uid, ExtraPids: extraPids(img.isolation)}),
			append(workOpts, withInit(initSetup{Binary: r.cfg.Init, Status: sb.statusPath, Nonce: sb.nonce, Timeout: lim.Timeout(), RunDir: sb.runDir}),
				captureCgroupsPath(&sb.cgroupsPath))...)...),
	)
	if err != nil {
		endSpan(span, err)
		return sb, fmt.Errorf("sandbox: create container %s: %w", sb.id, err)
	}
	sb.container = c
	// FIFOs rather than a terminal: stdout and stderr stay apart, and the
	// shim copies them to our capped writers.
	stdout, stderr := outputWriters(sb.hooks, sb)
	t, err := c.NewTask(dctx, cio.NewCreator(cio.WithStreams(sb.stdinR, stdout, stderr)))
	if err != nil {
		endSpan(span, err)
		return sb, fmt.Errorf("sandbox: create task %s: %w", sb.id, err)
	}
	sb.task = t
	if cgroups.Mode() != cgroups.Unified {
		if err := limitSocketMemory(cgroup1MemoryRoot, sb.cgroupsPath, lim.MemoryMB<<20); err != nil {
			endSpan(span, err)
			return sb, fmt.Errorf("sandbox: %s: %w", sb.id, err)
		}
	}
	// Wait before Start, so an exit that comes at once is not missed; on a
	// detached context, because the job's cancellation is handled by killing
	// the task, and the exit must still be seen after that.
	sb.exitCh, err = t.Wait(context.WithoutCancel(cctx))
	endSpan(span, err)
	if err != nil {
		return sb, fmt.Errorf("sandbox: wait on task %s: %w", sb.id, err)
	}
	if err := ctx.Err(); err != nil {
		return sb, fmt.Errorf("sandbox: %s: %w", sb.id, context.Cause(ctx))
	}

	sctx, span := r.tracer.Start(ctx, ktrace.SpanSandboxStart, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(jobID)))
	err = t.Start(sctx)
	endSpan(span, err)
	if err != nil {
		return sb, fmt.Errorf("sandbox: start task %s: %w", sb.id, err)
	}
	return sb, nil
}

// deliver hands the job to a prepared sandbox: the frame, then the job's
// stdin, then end of file. It returns when the clock starts. Writing happens
// in the background because a program that never reads stdin would otherwise
// block it; cleanup unblocks that writer.
func (r *Containerd) deliver(ctx context.Context, sb *sandbox, frame []byte, stdin string) (time.Time, error) {
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
		return started, fmt.Errorf("sandbox: close stdin of %s: %w", sb.id, err)
	}
	return started, nil
}

// wait waits for the task to exit, killing every process in it when the
// wall-clock limit passes or ctx ends.
func (r *Containerd) wait(ctx context.Context, sb *sandbox, timeout time.Duration) (ending, error) {
	ctx, span := r.tracer.Start(ctx, ktrace.SpanSandboxWait, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(sb.jobID)))
	defer span.End()
	var e ending
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var st containerd.ExitStatus
	select {
	case st = <-sb.exitCh:
	case <-timer.C:
		e.TimedOut = true
	case <-ctx.Done():
		e.Canceled = true
	}
	if e.TimedOut || e.Canceled {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := sb.task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			r.log.WarnContext(ctx, "kill sandbox", slog.String("container_id", sb.id), slog.Any("error", err))
		}
		select {
		case st = <-sb.exitCh:
		case <-kctx.Done():
			err := fmt.Errorf("sandbox: task %s did not exit within %s of SIGKILL", sb.id, cleanupTimeout)
			endSpan(span, err)
			return e, err
		}
	}
	code, _, err := st.Result()
	if err != nil {
		endSpan(span, err)
		return e, fmt.Errorf("sandbox: wait for task %s: %w", sb.id, err)
	}
	sb.exited = true
	e.TaskExit = code
	span.SetAttributes(ktrace.ExitCodeKey.Int(int(code)), attribute.Bool("kiln.timed_out", e.TimedOut))
	return e, nil
}

// collect reads the cgroup's figures (before the task is deleted: deleting it
// removes the cgroup), removes the sandbox, and builds the result.
func (r *Containerd) collect(ctx context.Context, sb *sandbox, res job.Result, e ending) job.Result {
	ctx, span := r.tracer.Start(ctx, ktrace.SpanSandboxCollect, trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(sb.jobID)))
	defer span.End()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	m, err := sb.task.Metrics(mctx)
	cancel()
	if err == nil {
		e.Usage, err = decodeMetrics(m.Data)
	}
	if err == nil && e.Usage.PeakEstimated && cgroups.Mode() == cgroups.Unified {
		if peak, ok := readMemoryPeak(cgroup2Root, sb.cgroupsPath); ok {
			e.Usage.MemoryPeak, e.Usage.PeakEstimated = max(e.Usage.MemoryPeak, peak), false
		}
	}
	if err != nil {
		// The run itself is sound; only its figures are missing.
		r.log.WarnContext(ctx, "sandbox metrics", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	r.drainOutput(ctx, sb)
	r.collectArtifacts(ctx, sb, &res)
	r.cleanup(ctx, sb)
	stdout, outTotal, outTrunc := sb.stdout.Bytes()
	stderr, errTotal, errTrunc := sb.stderr.Bytes()
	e.StderrTail = sb.stderr.Tail()

	res.Status, res.Error, res.ExitCode, res.Signal = outcome(e)
	res.SetOutput(stdout, stderr)
	res.StdoutBytes, res.StdoutTruncated = outTotal, outTrunc
	res.StderrBytes, res.StderrTruncated = errTotal, errTrunc
	res.CPUMS = e.Usage.CPU.Milliseconds()
	res.MemoryPeakBytes = e.Usage.MemoryPeak
	span.SetAttributes(
		ktrace.ExitCodeKey.Int(int(e.TaskExit)),
		ktrace.CPUTimeMSKey.Int64(res.CPUMS),
		ktrace.MemoryPeakKey.Int64(res.MemoryPeakBytes),
		ktrace.OutputBytesKey.Int64(outTotal+errTotal),
		ktrace.StatusKey.String(string(res.Status)),
	)
	return res
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
func (r *Containerd) drainOutput(ctx context.Context, sb *sandbox) {
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
		r.log.WarnContext(ctx, "sandbox output not drained in time; deleting the task anyway",
			slog.String("container_id", sb.id), slog.Duration("waited", outputDrainTimeout))
	}
}

// cleanup removes the task and the container (the root view is shared and
// stays), on a fresh context so it also runs when the job's context is
// cancelled. Idempotent.
func (r *Containerd) cleanup(ctx context.Context, sb *sandbox) {
	if sb == nil || sb.cleaned {
		return
	}
	sb.cleaned = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	gone := true // every process of the sandbox has ended
	if sb.task != nil {
		var opts []containerd.ProcessDeleteOpts
		if !sb.exited {
			// Error paths: the task may still be running; kill every process first.
			opts = append(opts, containerd.WithProcessKill)
		}
		if _, err := sb.task.Delete(ctx, opts...); err != nil && !errdefs.IsNotFound(err) {
			gone = false
			r.log.WarnContext(ctx, "delete sandbox task", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	if sb.uid != 0 {
		if gone {
			r.uids.release(sb.uid)
		} else {
			// Its processes may live on: the uid stays taken while this
			// worker runs rather than be shared with another job.
			r.log.WarnContext(ctx, "sandbox uid kept out of use", slog.String("container_id", sb.id), slog.Int("uid", sb.uid))
		}
	}
	if sb.container != nil {
		if err := sb.container.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			r.log.WarnContext(ctx, "delete sandbox container", slog.String("container_id", sb.id), slog.Any("error", err))
		}
	}
	// Unblocks the stdin writer if the program never read its input.
	sb.stdinR.CloseWithError(io.ErrClosedPipe)
	if err := removeStatusFile(sb.statusPath); err != nil {
		r.log.WarnContext(ctx, "sandbox status file", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	if err := removeRunDir(sb.runDir); err != nil {
		r.log.WarnContext(ctx, "sandbox run dir", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	r.releaseWorkDir(ctx, sb)
}

// withRootfs makes the image's shared read-only view the container's root
// file system (ensureRootfs). The container does not own the snapshot:
// deleting the container must leave it.
func withRootfs(snapshotter, key, imageName string) containerd.NewContainerOpts {
	return func(_ context.Context, _ *containerd.Client, c *containers.Container) error {
		c.Snapshotter, c.SnapshotKey, c.Image = snapshotter, key, imageName
		return nil
	}
}

// captureCgroupsPath records the cgroup path containerd's default spec chose.
func captureCgroupsPath(dst *string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux != nil {
			*dst = s.Linux.CgroupsPath
		}
		return nil
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// errNoWorker is returned by ReapOrphans without a worker id.
var errNoWorker = errors.New("sandbox: ReapOrphans needs a worker id")

// ErrCreate is in the chain of Run's error when the sandbox could not be
// created or started (containerd or runc refused), as opposed to a failure
// later on. The error also has a SandboxCreateFailed() bool method, for
// callers that match on behaviour rather than import this package.
var ErrCreate = errors.New("sandbox could not be created")

type createError struct{ err error }

func (e createError) Error() string             { return ErrCreate.Error() + ": " + e.err.Error() }
func (e createError) Unwrap() []error           { return []error{ErrCreate, e.err} }
func (e createError) SandboxCreateFailed() bool { return true }

// logContainerdVersion logs the daemon's version, and warns when it is a
// release line past its end of life (before 1.7).
func logContainerdVersion(ctx context.Context, client *containerd.Client, log *slog.Logger) {
	v, err := client.Version(ctx)
	if err != nil {
		log.WarnContext(ctx, "sandbox: containerd version", slog.Any("error", err))
		return
	}
	log.InfoContext(ctx, "sandbox: containerd", slog.String("version", v.Version))
	if eol(v.Version) {
		log.WarnContext(ctx, "sandbox: this containerd release line is past its end of life; deploy/local/containerd-build.sh builds the pinned 1.7 LTS",
			slog.String("version", v.Version))
	}
}

// eol reports whether a containerd version string ("v1.6.20", "1.6.20~ds1")
// is of a release line before 1.7.
func eol(version string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 1 || (major == 1 && minor < 7)
}
