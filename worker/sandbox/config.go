package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"

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
	StateDirDefault    = "/run/kiln/sandboxes"
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
	// CPUs is the CPU quota of one job, in cores (CFS quota/period).
	// Default: CPUsDefault (1.0).
	CPUs float64
	// Policy bounds the limits a job may carry; Run resolves every spec's
	// limits through it again, so a caller that skipped Resolve still cannot
	// run a job above the maximum. Default: job.DefaultPolicy().
	Policy job.Policy
	// StateDir holds each sandbox's host-side work dir tmpfs, under
	// <StateDir>/<WorkerID>/<container id>/work. Default: StateDirDefault.
	StateDir string
	// ArtifactCaps bound what is collected from a job's output dir; each
	// must be within job.MaxArtifactCaps. Default: job.DefaultArtifactCaps.
	ArtifactCaps job.ArtifactCaps
	// Logger receives lifecycle warnings (cleanup failures). Default: discard.
	Logger *slog.Logger
	// TracerProvider makes the sandbox.* spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

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
	c.StateDir = cmp.Or(c.StateDir, StateDirDefault)
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
	if !labelValue.MatchString(c.WorkerID) {
		errs = append(errs, fmt.Errorf("sandbox: WorkerID %q must be letters, digits, '.', '_' or '-'", c.WorkerID))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("sandbox: %w", err))
	}
	if err := c.ArtifactCaps.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("sandbox: %w", err))
	}
	return errors.Join(errs...)
}
