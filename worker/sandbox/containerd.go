package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
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

	pool    *pool
	boxes   *boxes
	spares  sessionSpares // a ready box per runtime for the next session (session_spare.go)
	running sync.Map      // job id → the box running it (box path only)
	// jobFilterFile holds the job seccomp filter boxes bind (writeJobFilter).
	jobFilterFile string
	boxRanges     *uidPool       // indices of the boxes' uid ranges (BoxConfig.UIDStart)
	cleaning      sync.WaitGroup // removals under way (retire)
	liveMu        sync.Mutex
	live          map[string]bool // container ids this runtime owns (track)
	// The lifecycle: Start starts the pool's goroutines (bg), Close stops them.
	lifeMu          sync.Mutex
	started, closed bool
	stop            context.CancelFunc
	bg              sync.WaitGroup
	shims           *shimGroups
	// life ends at Close: waits made again on tasks across a containerd
	// outage (outage.go) end with it.
	life    context.Context
	endLife context.CancelFunc
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
	r := &Containerd{
		cfg:       cfg,
		client:    client,
		tracer:    cfg.TracerProvider.Tracer("github.com/kilnrun/kiln/worker/sandbox"),
		log:       cfg.Logger,
		swapLimit: swapAccounted(),
		uids:      newUIDPool(cfg.UIDStart, cfg.UIDCount, cfg.UIDLockDir),
		images:    map[string]*imageEntry{},
		live:      map[string]bool{},
		shims:     newShimGroups(cfg.ShimGroupSize, randomHex(4)),
	}
	r.life, r.endLife = context.WithCancel(context.Background())
	r.pool = newPool(r, cfg.Pool)
	r.boxes = newBoxes(r, cfg.Boxes)
	r.jobFilterFile = filepath.Join(cfg.StateDir, cfg.WorkerID+"-job.bpf")
	r.boxRanges = newUIDPool(0, r.boxes.cfg.Ranges, filepath.Join(cfg.UIDLockDir, "boxes"))
	if !cfg.Boxes.Off {
		if err := r.writeJobFilter(); err != nil {
			r.endLife()
			client.Close()
			return nil, err
		}
	}
	return r, nil
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
// digest is unchanged. While containerd does not answer, the entry it last
// found stands (outage.go): a box needs no containerd to run a job.
func (r *Containerd) resolve(ctx context.Context, runtime string) (*imageEntry, error) {
	ref := r.cfg.Images[runtime]
	rec, err := r.client.ImageService().Get(ctx, ref)
	if err != nil {
		if e := r.cachedImage(runtime, ref); e != nil && unreachable(err) {
			return e, nil
		}
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
func (r *Containerd) Run(ctx context.Context, req Request) (job.Result, error) {
	id, spec := req.ID, req.Spec
	res := job.Result{ID: id}
	spec.Normalize()
	network := !spec.Network.Empty()
	lim, frame, err := r.check(id, spec)
	if err == nil && network {
		// After validation: the proxy's variables are the sandbox's own
		// (KILN_ names are refused in a spec).
		spec.Env = withEgressEnv(spec.Env)
		frame, err = encodeFrame(spec)
	}
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
		// Nothing of the job exists yet: the worker holds it while
		// containerd does not answer, as for a sandbox it could not create.
		return fail(createError{err})
	}
	res.Image = job.Image{Name: img.ref, Digest: img.digest.String()}
	// The caller's span says what the job ran, whichever path prepared its
	// sandbox (a box's or a pooled sandbox's creation is outside its trace).
	trace.SpanFromContext(ctx).SetAttributes(ktrace.ContainerImageNameKey.String(img.ref), ktrace.OCIManifestDigestKey.String(img.digest.String()))
	if err := spec.ValidateFor(img.profile.contract(img.pkgs)); err != nil {
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return res, fmt.Errorf("sandbox: job %s: %w", id, err)
	}
	if network && (!req.Net().Enabled() || img.isolation != IsolationRunc) {
		err := fmt.Errorf("%w (isolation %s): run it without \"network\", or on a worker with runc isolation", errNoEgress, img.isolation)
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return res, fmt.Errorf("sandbox: job %s: %w", id, err)
	}

	req.Spec = spec // normalized, with the proxy's variables
	if key, ok := r.boxable(spec.Runtime, img, lim, req.Tenant); ok {
		sb := r.boxes.take(ctx, key, img)
		if sb == nil {
			sb = r.boxes.await(ctx, key, img)
		}
		if sb != nil {
			out, err := r.runBox(ctx, sb, key, req, lim, res, r.endingFor(ctx, spec.Runtime, img, lim))
			if err == nil {
				return out, nil
			}
			if !errors.Is(err, errUnfit) {
				return fail(err)
			}
		} else {
			r.growBox(ctx, key.class, img)
		}
	}
	sb, err := r.acquire(ctx, req, img, lim)
	if err != nil {
		return fail(createError{err})
	}
	// A sandbox that ended on an error path is removed here; collect
	// retires the others itself, after their figures are read.
	defer r.retire(ctx, sb)
	var egress *egressRun
	if network {
		pid := sb.task.Pid()
		egress = serveEgress(ctx, req.Net(), func(context.Context) (net.Listener, error) { return listenInNetns(pid) })
		defer egress.finish()
	}
	started, err := r.deliver(ctx, sb, frame, spec.Stdin)
	if err != nil {
		return fail(err)
	}
	end, err := r.wait(ctx, sb, r.endingFor(ctx, spec.Runtime, img, lim))
	res.WallMS = time.Since(started).Milliseconds()
	if network {
		var eerr error
		if res.Egress, eerr = egress.finish(); eerr != nil {
			r.log.WarnContext(ctx, "the job's egress proxy did not start", slog.String("container_id", sb.id), slog.Any("error", eerr))
		}
	}
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
	end.CPULimit = sb.cpuLimit
	if end.CPUExceeded {
		// The watcher ended it: the limit it held was the job's own, not
		// RLIMIT_CPU's whole seconds.
		end.CPULimit = sb.cpuBudget
	}
	return r.collect(ctx, sb, res, end), nil
}

// endingFor is what the outcome of a job of runtime on img with lim needs
// besides how it ended.
func (r *Containerd) endingFor(ctx context.Context, runtime string, img *imageEntry, lim job.Limits) ending {
	return ending{Timeout: lim.Timeout(), MemoryLimit: lim.MemoryMB << 20, Runtime: runtime, ImageName: img.ref,
		Classifier: classifiers[img.profile.Classifier], HasModule: r.hasModule(ctx, runtime)}
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
