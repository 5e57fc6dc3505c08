package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	boxsrc "github.com/kilnrun/kiln/sandbox/box"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/namespaces"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
	ktrace "github.com/kilnrun/kiln/trace"
)

// cleanupTimeout bounds kill, metrics and delete calls, which run on a
// context detached from the job's so they survive its cancellation.
const cleanupTimeout = 30 * time.Second

// startTimeout bounds starting a sandbox's task (prepare).
const startTimeout = time.Minute

// Containerd is the Runtime backed by a containerd daemon and runc: the
// facade the worker calls (Run, OpenSession, Reap*, Image, RuntimeInfo,
// Healthy, Start and Close). It holds the parts that own the backend's
// concerns and wires them up: what a sandbox takes on the host (hostSide),
// the images (imageCache), one sandbox's container and task (lifecycle),
// the one executor of every run (executor), the boxes (boxClient), and the
// warm pool over its seam (pool, containerPool).
type Containerd struct {
	cfg    Config
	client *containerd.Client
	log    *slog.Logger

	live     *liveSet  // what this runtime owns
	hostSide *hostSide // uids, work dirs and their artifacts, the job filter
	images   *imageCache
	ct       *lifecycle
	exec     *executor
	cpool    *containerPool // the pool's backend
	box      *boxClient
	pool     *pool

	// Start starts the pool's and the boxes' goroutines (bg), Close stops them.
	lifeMu          sync.Mutex
	started, closed bool
	stop            context.CancelFunc
	bg              sync.WaitGroup
	// endLife ends lifecycle.life at Close: waits made again on
	// tasks across a containerd outage (outage.go) end with it.
	endLife context.CancelFunc
}

// New connects to containerd. It does not touch images; the first Run or
// Image call resolves (and if needed unpacks) them.
func New(ctx context.Context, cfg Config) (*Containerd, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkBinaries(cfg); err != nil {
		return nil, err
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("sandbox: connect to containerd at %s: %w", cfg.Address, err)
	}
	ctrd.LogVersion(ctx, client, cfg.Logger)
	r := wire(cfg, client)
	if !cfg.Boxes.Off {
		if err := r.hostSide.writeJobFilter(); err != nil {
			r.endLife()
			client.Close()
			return nil, err
		}
	}
	return r, nil
}

// checkBinaries refuses a configuration whose runc, kiln-init, runsc (under
// gVisor) or jail library (with boxes) is missing.
func checkBinaries(cfg Config) error {
	bins := []struct{ path, fix string }{
		{cfg.Runc, "install the pinned release with deploy/local/runc.sh or `make deps`"},
		{cfg.Init, "build and install it with `make init`"},
	}
	if cfg.usesGVisor() {
		bins = append(bins, struct{ path, fix string }{cfg.Runsc, "install runsc and its wrapper with deploy/local/runsc.sh or `make deps`"})
	}
	for _, b := range bins {
		if st, err := os.Stat(b.path); err != nil || st.Mode()&0o111 == 0 || !st.Mode().IsRegular() {
			return fmt.Errorf("sandbox: %s is missing or not executable (%s): %v", b.path, b.fix, err)
		}
	}
	if !cfg.Boxes.Off {
		if st, err := os.Stat(cfg.Jail); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("sandbox: the jail library %s is missing (build and install it with `make init`, or set %s): %v", cfg.Jail, EnvJail, err)
		}
	}
	return nil
}

// wire makes the runtime's parts over client and connects them.
func wire(cfg Config, client *containerd.Client) *Containerd {
	r := &Containerd{cfg: cfg, client: client, log: cfg.Logger, live: newLiveSet()}
	boxCfg := cfg.Boxes.withDefaults()
	life, endLife := context.WithCancel(context.Background())
	r.endLife = endLife
	be := &ctrd.Backend{Client: client, Snapshotter: cfg.Snapshotter, LeaseScope: cfg.LeaseScope, Log: cfg.Logger, Life: life, Owns: r.live.owns}
	r.hostSide = &hostSide{cfg: cfg, boxUIDStart: boxCfg.UIDStart, log: cfg.Logger, live: r.live,
		uids:          host.NewUIDPool(cfg.UIDStart, cfg.UIDCount, cfg.UIDLockDir),
		boxRanges:     host.NewUIDPool(0, boxCfg.Ranges, filepath.Join(cfg.UIDLockDir, "boxes")),
		jobFilterFile: filepath.Join(cfg.StateDir, cfg.WorkerID+"-job.bpf")}
	r.images = &imageCache{cfg: cfg, client: client, be: be, log: cfg.Logger, now: time.Now,
		entries: map[string]*imageEntry{}, checked: map[string]time.Time{}}
	tracer := cfg.TracerProvider.Tracer("github.com/kilnrun/kiln/sandbox")
	swapLimit := host.SwapAccounted()
	r.ct = &lifecycle{cfg: cfg, client: client, tracer: tracer, log: cfg.Logger, swapLimit: swapLimit, hostSide: r.hostSide,
		live: r.live, shims: ctrd.NewShimGroups(cfg.ShimGroupSize, randomHex(4)), be: be, life: life}
	r.exec = &executor{cfg: cfg, tracer: tracer, log: cfg.Logger, swapLimit: swapLimit, images: r.images}
	r.cpool = &containerPool{cfg: cfg, boxCfg: boxCfg, images: r.images, ct: r.ct}
	r.pool = newPool(r.cpool, cfg.Pool, cfg.Logger)
	r.box = &boxClient{cfg: cfg, boxCfg: boxCfg, log: cfg.Logger, ct: r.ct, hostSide: r.hostSide, live: r.live, images: r.images, cpool: r.cpool, exec: r.exec}
	r.box.boxes = boxsrc.NewSource[*sandbox, poolClass, *imageEntry](boxMaker{r.box}, boxsrc.Config{Max: boxCfg.Max, MaxAge: boxCfg.MaxAge,
		Neutral: boxCfg.Neutral, Wait: boxCfg.wait, Now: boxCfg.Now}, cfg.Logger)
	return r
}

// Runtimes lists the configured runtime names, sorted.
func (r *Containerd) Runtimes() []string { return runtimeNames(r.cfg) }

// runtimeNames lists cfg's runtime names, sorted.
func runtimeNames(cfg Config) []string {
	names := make([]string, 0, len(cfg.Images))
	for n := range cfg.Images {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Run runs one validated job (req.Spec, its limits already resolved) for
// req.Tenant, its output to req.Output, its artifacts to req.Store, its
// network (if it asks for one) served by req.Network. A bad spec gives an
// error wrapping *job.InvalidError and runs nothing, as does a network the
// request (or the isolation) cannot give. Platform faults give a Result
// with status internal_error (category internal, retryable) and a non-nil
// error. Cancelling ctx kills the job: status canceled (category canceled)
// and a nil error, since the job itself ran as asked.
func (r *Containerd) Run(ctx context.Context, req Request) (job.Result, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	pl, res, err := r.plan(ctx, req)
	if err != nil {
		return res, err
	}
	if key, ok := r.box.boxCfg.boxable(pl.req.Spec.Runtime, pl.img, pl.lim, req.Tenant, jobBoxUse(req.DedicatedBoxes)); ok {
		key.Class.lean = leanJob(r.cfg.Pool, pl.req.Spec.Runtime, pl.img, pl.req.Spec.Code)
		if out, err, done := r.box.runInBox(ctx, key, pl, res); done {
			return out, err
		}
	}
	return r.runInContainer(ctx, pl, res)
}

// plan is a job checked and resolved, ready for a sandbox: its request
// (the spec normalized, with the egress proxy's variables for a job with a
// network), limits, image and frame.
type plan struct {
	req   Request
	lim   job.Limits
	img   *imageEntry
	frame []byte
}

// plan checks a job and resolves what it runs on before anything is made.
// An error refuses the job (res says why: invalid_request, or the
// platform's fault when the image cannot be resolved).
func (r *Containerd) plan(ctx context.Context, req Request) (plan, job.Result, error) {
	id, spec := req.ID, req.Spec
	res := job.Result{ID: id}
	spec.Normalize()
	network := !spec.Network.Empty()
	refuse := func(err error) (plan, job.Result, error) {
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return plan{}, res, fmt.Errorf("sandbox: job %s: %w", id, err)
	}
	lim, frame, err := r.check(id, spec)
	if err == nil && network {
		// After validation: the proxy's variables are the sandbox's own
		// (KILN_ names are refused in a spec).
		spec.Env = withEgressEnv(spec.Env)
		frame, err = encodeFrame(spec)
	}
	if err != nil {
		return refuse(err)
	}
	res.Limits = &lim
	img, err := r.images.resolve(ctx, spec.Runtime)
	if err != nil {
		// Nothing of the job exists yet: the worker holds it while
		// containerd does not answer, as for a sandbox it could not create.
		out, err := failed(ctx, res, createError{err})
		return plan{}, out, err
	}
	res.Image = job.Image{Name: img.ref, Digest: img.digest.String()}
	// The caller's span says what the job ran, whichever path prepared its
	// sandbox (a box's or a pooled sandbox's creation is outside its trace).
	trace.SpanFromContext(ctx).SetAttributes(ktrace.ContainerImageNameKey.String(img.ref), ktrace.OCIManifestDigestKey.String(img.digest.String()))
	if err := spec.ValidateFor(img.profile.Contract(img.pkgs)); err != nil {
		return refuse(err)
	}
	if network && (!req.Net().Enabled() || img.isolation != IsolationRunc) {
		return refuse(fmt.Errorf("%w (isolation %s): run it without \"network\", or on a worker with runc isolation", errNoEgress, img.isolation))
	}
	req.Spec = spec // normalized, with the proxy's variables
	return plan{req: req, lim: lim, img: img, frame: frame}, res, nil
}

// failed is the result of a run the platform failed: internal_error, or
// canceled when the fault is the run's cancellation.
func failed(ctx context.Context, res job.Result, err error) (job.Result, error) {
	if ctx.Err() != nil {
		res.Status, res.Error = job.StatusCanceled, job.NewFailure(job.CategoryCanceled, "canceled before the program finished")
		return res, nil
	}
	res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, err.Error())
	return res, err
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
