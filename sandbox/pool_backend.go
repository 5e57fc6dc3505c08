package sandbox

import (
	"context"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
)

// poolBackend is what the pool prepares, measures and removes its
// sandboxes with: the containerd backend, or a fake in the unit tests
// (pool_backend_test.go). Containerd's methods: Runtimes (containerd.go),
// resolve (images.go), defaultClass and creationLimits (pool_class.go),
// retire (acquire.go), and the two below.
type poolBackend interface {
	// Runtimes lists the runtimes, sorted.
	Runtimes() []string
	// resolve returns runtime's image as it is now.
	resolve(ctx context.Context, runtime string) (*imageEntry, error)
	// defaultClass is the class of runtime's default limits and whether
	// its jobs run in boxes.
	defaultClass(runtime string, img *imageEntry) (poolClass, bool, error)
	// creationLimits are the limits a sandbox of cls is created with.
	creationLimits(img *imageEntry, cls poolClass) (job.Limits, error)
	// prepareIdle creates and starts a sandbox of cls ahead of its job and
	// returns once its launcher waits for the job (having imported
	// preload). On error the sandbox it returns, if any, is still to be
	// retired.
	prepareIdle(ctx context.Context, img *imageEntry, cls poolClass, lim job.Limits, preload []string) (*sandbox, error)
	// retire removes a sandbox.
	retire(ctx context.Context, sb *sandbox)
	// idleMemory is what an idle sandbox's cgroup counts as its memory.
	idleMemory(sb *sandbox) (int64, error)
}

var _ poolBackend = (*Containerd)(nil)

// prepareIdle prepares a pooled sandbox of class cls (poolBackend) and
// waits for its launcher.
func (r *Containerd) prepareIdle(ctx context.Context, img *imageEntry, cls poolClass, lim job.Limits, preload []string) (*sandbox, error) {
	sb, err := r.prepare(ctx, img, prepOpts{lim: lim, preload: preload, class: cls})
	if err != nil {
		return sb, err
	}
	// Started is not yet running: a job armed before kiln-init has forked
	// the launcher would find no process to set limits on.
	return sb, awaitLauncher(ctx, sb, len(preload) > 0)
}

// idleMemory is what an idle sandbox's cgroup counts as its memory
// (poolBackend).
func (r *Containerd) idleMemory(sb *sandbox) (int64, error) {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return 0, err
	}
	return cg.MemoryUsage()
}
