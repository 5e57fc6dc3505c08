package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
)

// Defaults applied by Config.withDefaults.
const (
	AddressDefault     = "/run/containerd/containerd.sock"
	NamespaceDefault   = "kiln"
	SnapshotterDefault = "overlayfs"
	CPUsDefault        = 1.0
	// RuncDefault is where deploy/local/runc.sh installs the pinned runc.
	RuncDefault = "/usr/local/lib/kiln/runc"
	// RunscDefault is where deploy/local/runsc.sh installs the wrapper that
	// runs Debian's runsc with Kiln's global flags.
	RunscDefault = "/usr/local/lib/kiln/runsc-kiln"
	// InitDefault is where `make init` installs kiln-init.
	InitDefault = "/usr/local/lib/kiln/kiln-init"
	// JailDefault is where `make init` installs the jail library
	// (sandbox/jail), beside kiln-init.
	JailDefault = "/usr/local/lib/kiln/libkilnjail.so"
	// EnvJail, when set, names the jail library instead of JailDefault
	// (the Makefile's KILN_JAIL: a checkout's own build, under test).
	EnvJail = "KILN_JAIL"
	// StateDirDefault holds the sandboxes' status files.
	StateDirDefault = "/run/kiln/sandboxes"
	// UIDStartDefault and UIDCountDefault: the host uids 100000-165535.
	UIDStartDefault = 100_000
	UIDCountDefault = 65_536
	// UIDLockDirDefault holds one lock file per uid in use on the host.
	UIDLockDirDefault = "/run/kiln/uids"
	// ShimGroupSizeDefault is Config.ShimGroupSize's default.
	ShimGroupSizeDefault = 1
)

// ImagesDefault is the runtime → image reference map used when Config.Images is empty.
func ImagesDefault() map[string]string {
	return map[string]string{"python": "kiln.local/python:latest"}
}

// Config configures a Containerd runtime. The zero value is usable.
type Config struct {
	// Address is containerd's gRPC socket. Default: AddressDefault.
	// Commands read KILN_CONTAINERD_ADDRESS and pass it here; this package
	// reads no environment.
	Address string
	// Namespace is the containerd namespace every container, task and
	// snapshot lives in. Default: NamespaceDefault ("kiln").
	Namespace string
	// Snapshotter unpacks images and holds each job's read-only root view.
	// Default: SnapshotterDefault ("overlayfs").
	Snapshotter string
	// Images maps a runtime name to an image reference in Namespace.
	// Default: ImagesDefault() ({"python": "kiln.local/python:latest"}).
	Images map[string]string
	// WorkerID labels every container (kiln.worker) so ReapOrphans can find
	// what a crashed predecessor with the same id left. Default: the host name.
	WorkerID string
	// Runc is the runc binary containerd's runc-v2 shim runs for every
	// sandbox (the shim's BinaryName option), so the pinned, patched release
	// is used whatever runc the host has on PATH. New fails when it is
	// missing. Default: RuncDefault (/usr/local/lib/kiln/runc, installed by
	// deploy/local/runc.sh).
	Runc string
	// Runsc is the OCI runtime binary the runc-v2 shim runs for a runtime
	// whose isolation is gvisor: a wrapper that runs runsc with the flags
	// Kiln needs (--network=none, --oci-seccomp). New fails when it is
	// missing and Isolation forces gvisor; a profile asking for gvisor
	// without it fails that runtime's jobs as internal errors. Default:
	// RunscDefault (/usr/local/lib/kiln/runsc-kiln, installed by
	// deploy/local/runsc.sh).
	Runsc string
	// Isolation overrides, per runtime name, the isolation the image's
	// profile asks for: "runc" or "gvisor" (the worker's --isolation
	// flag). Default: nil, every runtime runs as its profile says.
	Isolation map[string]string
	// Init is the host path of kiln-init (cmd/kiln-init), bind-mounted
	// read-only into every sandbox as its pid 1. New fails when it is
	// missing. Default: InitDefault (/usr/local/lib/kiln/kiln-init,
	// installed by `make init`).
	Init string
	// Jail is the host path of the jail library (sandbox/jail), bound
	// read-only into every box: each job's process calls it to make its
	// inner sandbox. New fails when it is missing and boxes are on.
	// Default: $KILN_JAIL (EnvJail) when set, else JailDefault
	// (/usr/local/lib/kiln/libkilnjail.so, installed by `make init`).
	Jail string
	// StateDir is the host directory of the sandboxes' status files (one
	// small file per live sandbox, where kiln-init reports how the program
	// ended) and of their host-side work dir tmpfs, under
	// <StateDir>/<WorkerID>/<container id>/work. Default: StateDirDefault
	// (/run/kiln/sandboxes).
	StateDir string
	// UIDStart and UIDCount are the host uids sandboxes run as, one per live
	// sandbox (its gid is the same number), so the kernel's per-user limits
	// are per job. The range must hold no real user of the host. Workers on
	// one host may share it: a uid is taken with a flock in UIDLockDir.
	// In a container of its own, kiln-init runs as the sandbox's uid +
	// UIDCount (its supervisor's, which no job has), so the UIDCount uids
	// above the range must hold no real user either.
	// Default: UIDStartDefault (100000) and UIDCountDefault (65536):
	// jobs 100000-165535, supervisors 165536-231071.
	UIDStart int
	UIDCount int
	// UIDLockDir holds the per-uid lock files shared by the workers of a
	// host. Default: UIDLockDirDefault (/run/kiln/uids).
	UIDLockDir string
	// LeaseScope names the store whose worker leases the caller's keep
	// function of ReapExpired reads (cache.Store.Identity); sandboxes are
	// labelled with it, and a sweep judges by lease only the sandboxes of its
	// own scope. Default: "" (one scope for every runtime without one).
	LeaseScope string
	// CPUs is the CPU quota of one job, in cores (CFS quota/period).
	// Default: CPUsDefault (1.0).
	CPUs float64
	// Policy bounds the limits a job may carry; Run resolves every spec's
	// limits through it again, so a caller that skipped Resolve still cannot
	// run a job above the maximum. Default: job.DefaultPolicy().
	Policy job.Policy
	// ArtifactCaps bound what is collected from a job's output dir; each
	// must be within job.MaxArtifactCaps. Default: job.DefaultArtifactCaps.
	ArtifactCaps job.ArtifactCaps
	// Logger receives lifecycle warnings (cleanup failures). Default: discard.
	Logger *slog.Logger
	// TracerProvider makes the sandbox.* spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Pool keeps sandboxes prepared ahead of demand (PoolConfig); it fills
	// once Start is called. Default: the zero PoolConfig, no pool: every job
	// gets a sandbox created for it.
	Pool PoolConfig
	// Boxes configures boxes (BoxConfig), the default home of every job
	// whose runtime supports them. Default: the zero BoxConfig (on).
	Boxes BoxConfig
	// ShimGroupSize is how many sandboxes in a row share one containerd
	// runc-v2 shim process (the shim's group annotation) instead of a shim
	// each. Off by default: the one measurement (a sequential cold job 55
	// ms slower, no CPU saved, on the 2-core development host) was taken
	// while the group's annotation never reached a container's spec, so it
	// measured the group's bookkeeping, not sharing; measure it on your
	// hosts before turning it on. Default: ShimGroupSizeDefault (1, a shim
	// per sandbox).
	ShimGroupSize int
	// CleanupBeforeReply removes each sandbox before Run returns its
	// result, as the runtime did before removal moved off the reply path.
	// For benchmarks that measure that change. Default: false.
	CleanupBeforeReply bool
	// Fleet lists the runtimes the whole fleet advertises (the worker passes
	// the registry's), so a failed import can name another runtime that has
	// the module. Default: nil, only this worker's own runtimes are named.
	Fleet func(ctx context.Context) ([]job.RuntimeInfo, error)
}

// RuntimesDefault are the runtimes a worker serves unless told otherwise
// (kiln worker --runtimes); `make image` builds the same list.
func RuntimesDefault() []string { return []string{"python", "python-slim", "node"} }

// ImagesFor builds Config.Images from runtime names as the worker's
// --runtimes flag gives them: "name" runs kiln.local/name:latest (what
// `make image RUNTIME=name` builds), "name=ref" runs ref.
func ImagesFor(names []string) (map[string]string, error) {
	out := make(map[string]string, len(names))
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		name, ref, ok := strings.Cut(n, "=")
		if !ok {
			ref = "kiln.local/" + name + ":latest"
		}
		if !runtimeName.MatchString(name) || ref == "" {
			return nil, fmt.Errorf("sandbox: runtime %q: want a name of lower-case letters, digits, '_' or '-', optionally =image-reference", n)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("sandbox: runtime %s is listed twice", name)
		}
		out[name] = ref
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sandbox: no runtime listed")
	}
	return out, nil
}

// runtimeName is what a recipe folder may be called: one NATS subject token.
var runtimeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

func (c Config) withDefaults() Config {
	c.Address = cmp.Or(c.Address, AddressDefault)
	c.Namespace = cmp.Or(c.Namespace, NamespaceDefault)
	c.Snapshotter = cmp.Or(c.Snapshotter, SnapshotterDefault)
	if len(c.Images) == 0 {
		c.Images = ImagesDefault()
	} else {
		c.Images = maps.Clone(c.Images)
	}
	if c.WorkerID == "" {
		c.WorkerID, _ = os.Hostname()
	}
	c.CPUs = cmp.Or(c.CPUs, CPUsDefault)
	c.ShimGroupSize = cmp.Or(c.ShimGroupSize, ShimGroupSizeDefault)
	c.Runc = cmp.Or(c.Runc, RuncDefault)
	c.Runsc = cmp.Or(c.Runsc, RunscDefault)
	c.Isolation = maps.Clone(c.Isolation)
	c.Init = cmp.Or(c.Init, InitDefault)
	c.Jail = cmp.Or(c.Jail, os.Getenv(EnvJail), JailDefault)
	c.StateDir = cmp.Or(c.StateDir, StateDirDefault)
	c.UIDStart = cmp.Or(c.UIDStart, UIDStartDefault)
	c.UIDCount = cmp.Or(c.UIDCount, UIDCountDefault)
	c.UIDLockDir = cmp.Or(c.UIDLockDir, UIDLockDirDefault)
	c.ArtifactCaps.MaxFiles = cmp.Or(c.ArtifactCaps.MaxFiles, job.DefaultArtifactCaps.MaxFiles)
	c.ArtifactCaps.MaxFileBytes = cmp.Or(c.ArtifactCaps.MaxFileBytes, job.DefaultArtifactCaps.MaxFileBytes)
	c.ArtifactCaps.MaxTotalBytes = cmp.Or(c.ArtifactCaps.MaxTotalBytes, job.DefaultArtifactCaps.MaxTotalBytes)
	c.Policy = cmp.Or(c.Policy, job.DefaultPolicy())
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	return c
}

// labelValue is what containerd accepts in a label filter without surprises.
var labelValue = regexp.MustCompile(`^[A-Za-z0-9._-]{0,128}$`)

// Validate reports every problem with the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.CPUs < 0.01 || c.CPUs > 64 {
		errs = append(errs, fmt.Errorf("sandbox: CPUs %.3f must be between 0.01 and 64", c.CPUs))
	}
	for rt, ref := range c.Images {
		if rt == "" || ref == "" {
			errs = append(errs, fmt.Errorf("sandbox: Images entry %q → %q: runtime name and image reference must both be set", rt, ref))
		}
	}
	for rt, iso := range c.Isolation {
		if _, err := parseIsolation(iso); err != nil {
			errs = append(errs, fmt.Errorf("sandbox: Isolation of runtime %q: %w", rt, err))
		}
		if _, ok := c.Images[rt]; !ok {
			errs = append(errs, fmt.Errorf("sandbox: Isolation names runtime %q, which this worker does not serve", rt))
		}
	}
	if c.UIDStart < 1000 || c.UIDCount < 1 || int64(c.UIDStart)+2*int64(c.UIDCount) > 1<<31 {
		errs = append(errs, fmt.Errorf("sandbox: UIDStart %d and UIDCount %d must give uids, and their supervisors' (UIDCount above them), from 1000 up to 2^31-1", c.UIDStart, c.UIDCount))
	}
	if !labelValue.MatchString(c.WorkerID) {
		errs = append(errs, fmt.Errorf("sandbox: WorkerID %q must be letters, digits, '.', '_' or '-'", c.WorkerID))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("sandbox: %w", err))
	}
	if err := c.Pool.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Boxes.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.ArtifactCaps.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("sandbox: %w", err))
	}
	return errors.Join(errs...)
}
