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

// Containerd is the Runtime backed by a containerd daemon and runc.
type Containerd struct {
	cfg       Config
	client    *containerd.Client
	tracer    trace.Tracer
	log       *slog.Logger
	swapLimit bool
	uids      *host.UIDPool

	mu     sync.Mutex
	images map[string]*imageEntry // by runtime and reference (imageKey)

	pool    *pool
	boxes   *boxsrc.Source[*sandbox, poolClass, *imageEntry] // the box source (package box), over boxMaker
	boxCfg  BoxConfig                                        // cfg.Boxes with its defaults
	spares  sessionSpares                                    // a ready box per runtime for the next session (session_spare.go)
	running sync.Map                                         // job id → the box running it (box path only)
	// judged, when set (tests), is called with the id of every run judged.
	judged func(id string)
	// jobFilterFile holds the job seccomp filter boxes bind (writeJobFilter).
	jobFilterFile string
	boxRanges     *host.UIDPool  // indices of the boxes' uid ranges (BoxConfig.UIDStart)
	cleaning      sync.WaitGroup // removals under way (retire)
	liveMu        sync.Mutex
	live          map[string]bool // container ids this runtime owns (track)
	// The lifecycle: Start starts the pool's goroutines (bg), Close stops them.
	lifeMu          sync.Mutex
	started, closed bool
	stop            context.CancelFunc
	bg              sync.WaitGroup
	shims           *ctrd.ShimGroups
	// be is the containerd backend: root views, waits across an outage,
	// reaping (package containerd).
	be *ctrd.Backend
	// life ends at Close: waits made again on tasks across a containerd
	// outage (outage.go) end with it.
	life    context.Context
	endLife context.CancelFunc
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
	if !cfg.Boxes.Off {
		if st, err := os.Stat(cfg.Jail); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("sandbox: the jail library %s is missing (build and install it with `make init`, or set %s): %v", cfg.Jail, EnvJail, err)
		}
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("sandbox: connect to containerd at %s: %w", cfg.Address, err)
	}
	ctrd.LogVersion(ctx, client, cfg.Logger)
	r := &Containerd{
		cfg:       cfg,
		client:    client,
		tracer:    cfg.TracerProvider.Tracer("github.com/kilnrun/kiln/sandbox"),
		log:       cfg.Logger,
		swapLimit: host.SwapAccounted(),
		uids:      host.NewUIDPool(cfg.UIDStart, cfg.UIDCount, cfg.UIDLockDir),
		images:    map[string]*imageEntry{},
		live:      map[string]bool{},
		shims:     ctrd.NewShimGroups(cfg.ShimGroupSize, randomHex(4)),
	}
	r.life, r.endLife = context.WithCancel(context.Background())
	r.be = &ctrd.Backend{Client: client, Snapshotter: cfg.Snapshotter, LeaseScope: cfg.LeaseScope, Log: cfg.Logger, Life: r.life, Owns: r.owns}
	r.pool = newPool(r, cfg.Pool, cfg.Logger)
	r.boxCfg = cfg.Boxes.withDefaults()
	r.boxes = boxsrc.NewSource[*sandbox, poolClass, *imageEntry](boxMaker{r}, boxsrc.Config{Max: r.boxCfg.Max, MaxAge: r.boxCfg.MaxAge,
		Neutral: r.boxCfg.Neutral, Wait: r.boxCfg.wait, Now: r.boxCfg.Now}, cfg.Logger)
	r.jobFilterFile = filepath.Join(cfg.StateDir, cfg.WorkerID+"-job.bpf")
	r.boxRanges = host.NewUIDPool(0, r.boxCfg.Ranges, filepath.Join(cfg.UIDLockDir, "boxes"))
	if !cfg.Boxes.Off {
		if err := r.writeJobFilter(); err != nil {
			r.endLife()
			client.Close()
			return nil, err
		}
	}
	return r, nil
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
	if key, ok := r.boxable(pl.req.Spec.Runtime, pl.img, pl.lim, req.Tenant, jobBoxUse(req.DedicatedBoxes)); ok {
		key.Class.lean = leanJob(r.cfg.Pool, pl.req.Spec.Runtime, pl.img, pl.req.Spec.Code)
		if out, err, done := r.runInBox(ctx, key, pl, res); done {
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
	img, err := r.resolve(ctx, spec.Runtime)
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
