package sandbox

import (
	"context"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
)

// poolBackend is what the pool prepares, measures and removes its
// sandboxes with: containerPool on containerd, or a fake in the unit tests
// (pool_backend_test.go). containerPool's methods: Runtimes, resolve and
// retire (below, over imageCache and lifecycle), defaultClass and
// creationLimits (pool_class.go), and prepareIdle and idleMemory.
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

// containerPool is the pool's backend on containerd: the runtimes' images
// (imageCache), their classes' limits (pool_class.go), and sandboxes made,
// measured and removed by lifecycle.
type containerPool struct {
	cfg    Config
	boxCfg BoxConfig
	images *imageCache
	ct     *lifecycle
}

var _ poolBackend = (*containerPool)(nil)

// Runtimes lists the runtimes, sorted.
func (cp *containerPool) Runtimes() []string { return runtimeNames(cp.cfg) }

// resolve returns runtime's image as it is now.
func (cp *containerPool) resolve(ctx context.Context, runtime string) (*imageEntry, error) {
	return cp.images.resolve(ctx, runtime)
}

// retire removes a sandbox.
func (cp *containerPool) retire(ctx context.Context, sb *sandbox) { cp.ct.retire(ctx, sb) }

// prepareIdle prepares a pooled sandbox of class cls (poolBackend) and
// waits for its launcher.
func (cp *containerPool) prepareIdle(ctx context.Context, img *imageEntry, cls poolClass, lim job.Limits, preload []string) (*sandbox, error) {
	sb, err := cp.ct.prepare(ctx, img, prepOpts{lim: lim, preload: preload, class: cls})
	if err != nil {
		return sb, err
	}
	// Started is not yet running: a job armed before kiln-init has forked
	// the launcher would find no process to set limits on.
	return sb, awaitLauncher(ctx, sb, len(preload) > 0)
}

// idleMemory is what an idle sandbox's cgroup counts as its memory
// (poolBackend).
func (cp *containerPool) idleMemory(sb *sandbox) (int64, error) {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return 0, err
	}
	return cg.MemoryUsage()
}
