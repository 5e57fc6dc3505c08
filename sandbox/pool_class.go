package sandbox

import (
	"time"

	"github.com/kilnrun/kiln/job"
)

// poolClass is what a sandbox must be created with and a job's limits
// cannot change afterwards: the runtime (its image), the size of the
// tmpfs mounts, and for a runtime whose launcher flags depend on the memory
// limit (node's heap), that limit. The rest (memory, pids, CPU, timeout,
// output) is armed when the job arrives.
type poolClass struct {
	runtime string
	diskMB  int64
	heapMB  int64
	// lean: a box whose zygote preloads nothing, for jobs that import
	// nothing its runtime's list holds (leanJob).
	lean bool
}

func classOf(runtime string, img *imageEntry, lim job.Limits) poolClass {
	c := poolClass{runtime: runtime, diskMB: lim.DiskMB}
	if img.profile.HeapFlagged() {
		c.heapMB = lim.MemoryMB
	}
	return c
}

// preloadOf is what runtime's zygotes and pooled sandboxes preload: its
// profile's list, or pc's for it.
func preloadOf(pc PoolConfig, runtime string, img *imageEntry) []string {
	if mods, ok := pc.Preload[runtime]; ok {
		return mods
	}
	return img.profile.Preload
}

// leanJob reports whether a job of runtime with code is to run in a lean
// box: its runtime preloads something (under pc), and the code imports
// none of it (runtimes.Profile.NeedsPreload).
func leanJob(pc PoolConfig, runtime string, img *imageEntry, code string) bool {
	prof := img.profile
	prof.Preload = preloadOf(pc, runtime, img)
	return len(prof.Preload) > 0 && !prof.NeedsPreload(code)
}

// defaultClass is the class of runtime's default limits (its profile's,
// under the policy) and whether its jobs run in boxes.
func (cp *containerPool) defaultClass(runtime string, img *imageEntry) (poolClass, bool, error) {
	lim, err := cp.cfg.Policy.Resolve(img.profile.Limits)
	if err != nil {
		return poolClass{}, false, err
	}
	_, boxed := cp.boxCfg.boxable(runtime, img, lim, "", boxShared)
	return classOf(runtime, img, lim), boxed, nil
}

// creationLimits are the limits a sandbox of class cls is created with
// ahead of its job: the runtime's defaults, so a job with the default limits
// (most jobs) needs no cgroup or rlimit write when it arrives, but the
// policy's longest timeout for kiln-init's own backstop (the worker's clock
// times the job), a second of CPU more for the preloading, and the class's
// disk and heap.
func (cp *containerPool) creationLimits(img *imageEntry, cls poolClass) (job.Limits, error) {
	lim, err := cp.cfg.Policy.Resolve(img.profile.Limits)
	if err != nil {
		return job.Limits{}, err
	}
	lim.DiskMB = cls.diskMB
	if cls.heapMB > 0 {
		lim.MemoryMB = cls.heapMB
	}
	lim.TimeoutMS = cp.cfg.Policy.Max.TimeoutMS
	lim.CPUMS += preloadCPUAllowance.Milliseconds()
	lim.OutputBytes = cp.cfg.Policy.Max.OutputBytes
	return lim, nil
}

// preloadCPUAllowance is CPU time a pooled sandbox is created with beyond
// the default limit, for its launcher's preloading: a default job's limit,
// counted on top of what the preloading used, then needs no change.
const preloadCPUAllowance = time.Second

// Runtime names the class's runtime (the box source's logs).
func (c poolClass) Runtime() string { return c.runtime }
