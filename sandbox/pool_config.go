package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Defaults of PoolConfig.
const (
	PoolMemoryBudgetDefault = 1 << 30
	PoolMaxIdleDefault      = 4 * time.Minute // under kiln-init's own idle limit (initIdleLimit)
	// poolMaxClasses bounds how many limits classes one pool keeps
	// sandboxes for: a class is only worth keeping warm while jobs use it.
	poolMaxClasses = 8
	// poolRetry is how long the refill waits after a failed prepare.
	poolRetry = 2 * time.Second
)

// poolIDPrefix starts a pooled sandbox's container id: no job exists when it
// is named.
const poolIDPrefix = "kiln-pool-"

// PoolConfig configures the warm pool: sandboxes created and started ahead
// of demand (their launchers waiting on stdin, the runtime's preload modules
// imported), each of which still serves exactly one job. The zero value
// keeps no pool.
type PoolConfig struct {
	// Max is the most idle sandboxes kept per runtime and limits class.
	// Default: 0, no pool.
	Max int
	// Min is how many idle sandboxes of each runtime's default limits class
	// are kept whatever the demand. The size follows demand between Min and
	// Max: a job that found the pool empty raises it by one, and a minute
	// without such a miss lowers it by one. Default: 0.
	Min int
	// MemoryBudget bounds the memory all idle sandboxes together hold, as
	// their cgroups count it, in bytes. Default: PoolMemoryBudgetDefault (1 GiB).
	MemoryBudget int64
	// MaxIdle is how long a sandbox may wait for a job before it is
	// replaced. Default: PoolMaxIdleDefault (4 minutes).
	MaxIdle time.Duration
	// Preload overrides, per runtime, the modules its profile preloads
	// (runtimes.Profile.Preload); a runtime listed with no modules preloads
	// none. Default: nil, every runtime preloads what its profile says.
	Preload map[string][]string
	// Busy reports whether every slot of the worker is running a job. The
	// pool does not refill while it is: preparing a sandbox costs as much
	// CPU as a cold job, and the jobs already running come first. Default:
	// nil, never busy.
	Busy func() bool
	// Now is the clock the pool judges by: how long a sandbox has waited
	// (MaxIdle, against the time it was prepared) and how long a class has
	// gone without a miss. Default: time.Now.
	Now func() time.Time
	// Hooks signal what the pool does, for tests to wait on. Default: none.
	Hooks PoolHooks
}

// PoolHooks are signals of the pool's work. Each is called synchronously
// where the event happens, so it must return quickly; a nil hook is
// skipped.
type PoolHooks struct {
	// Refilled: a sandbox was prepared and waits in the pool.
	Refilled func(PoolEvent)
	// Retired: an idle sandbox left the pool for good (it ended, outlived
	// MaxIdle, is of a replaced image, or is above its class's target).
	Retired func(PoolEvent)
}

// PoolEvent names the sandbox a PoolHooks function is told of.
type PoolEvent struct {
	Runtime string
	ID      string // the sandbox's container id
}

func (c PoolConfig) withDefaults() PoolConfig {
	c.MemoryBudget = cmp.Or(c.MemoryBudget, PoolMemoryBudgetDefault)
	c.MaxIdle = cmp.Or(c.MaxIdle, PoolMaxIdleDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration the pool cannot run with.
func (c PoolConfig) Validate() error {
	var errs []error
	if c.Max < 0 || c.Min < 0 || c.Min > c.Max {
		errs = append(errs, fmt.Errorf("sandbox: pool Min %d and Max %d must satisfy 0 <= Min <= Max", c.Min, c.Max))
	}
	if c.MemoryBudget < 0 {
		errs = append(errs, fmt.Errorf("sandbox: pool MemoryBudget %d must not be negative", c.MemoryBudget))
	}
	if c.MaxIdle < 0 || c.MaxIdle > initIdleLimit {
		errs = append(errs, fmt.Errorf("sandbox: pool MaxIdle %s must be between 0 and %s (kiln-init ends a sandbox that waited that long)", c.MaxIdle, initIdleLimit))
	}
	return errors.Join(errs...)
}

// PoolStats are a runtime's pool figures, for metrics.
type PoolStats struct {
	Runtime string
	Idle    int // sandboxes waiting for a job
	Target  int // idle sandboxes the pool is filling towards
	Hits    int64
	Misses  int64
	// Unfit counts pooled sandboxes that could not take their job's limits
	// (the launcher already held more memory than the job may use): the
	// job ran cold.
	Unfit int64
	// Refills counts sandboxes prepared for the pool; RefillTime is the
	// time they took in all.
	Refills    int64
	RefillTime time.Duration
	// MemoryBytes is what the idle sandboxes hold, by their cgroups.
	MemoryBytes int64
}
