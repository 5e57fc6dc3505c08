package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Defaults of BoxConfig.
const (
	BoxMaxJobsDefault  = 500
	BoxMaxAgeDefault   = 30 * time.Minute
	BoxMaxDefault      = 8
	BoxNeutralDefault  = 1
	BoxUIDStartDefault = 1 << 30
	BoxRangesDefault   = 4096
	// boxUIDRange is how many host uids a box's user namespace maps: root
	// of the box, its supervisor, and every job uid it hands out.
	boxUIDRange = 65536
	// Job uids inside a box are drawn from [boxJobUIDMin, boxJobUIDMax).
	boxJobUIDMin = 1000
	boxJobUIDMax = 65000
)

// BoxConfig configures boxes: long-lived, hardened containers, each with a
// user namespace of its own, whose supervisor gives every job a fresh inner
// sandbox (fresh pid, mount, ipc, uts and network namespaces, fresh tmpfs, a
// uid of its own, no capabilities; deploy/images/python/box.py). A box
// serves one tenant for its whole life and one job at a time. Boxes are the
// default for every runtime whose profile supports them (runtimes.Profile.Box)
// under runc; other jobs run in a container of their own.
type BoxConfig struct {
	// Off turns boxes off: every job runs in a container of its own.
	Off bool
	// MaxJobs is how many jobs a box serves before it is retired.
	// Default: BoxMaxJobsDefault (500).
	MaxJobs int
	// MaxAge is how long a box serves jobs before it is retired.
	// Default: BoxMaxAgeDefault (30 minutes).
	MaxAge time.Duration
	// Max bounds this worker's boxes, idle or busy, neutral or a tenant's;
	// an idle box of another tenant is retired to make room. Default:
	// BoxMaxDefault (8).
	Max int
	// Neutral is how many boxes of each runtime (default limits) are kept
	// ready that no tenant has used yet. Default: BoxNeutralDefault (1).
	Neutral int
	// UIDStart is the first host uid of the boxes' ranges: box i maps
	// UIDStart + i*65536 and the 65535 uids after it. Default:
	// BoxUIDStartDefault (2^30).
	UIDStart int
	// Ranges is how many such ranges the workers of a host share (each
	// taken with a flock in Config.UIDLockDir/boxes). Default:
	// BoxRangesDefault (4096).
	Ranges int
	// AtDelivery makes each job's inner sandbox when the job arrives,
	// instead of ahead of it while its box is idle (box_prepared.go).
	AtDelivery bool
	// Now is the clock boxes are judged by: a box's age (MaxAge, from when
	// its supervisor was ready), when it last served a job (which idle box
	// is retired at Max), and the back-off after a failed creation.
	// Default: time.Now.
	Now func() time.Time

	// wait makes a job that finds no box wait for one instead of running
	// in a container of its own (the sandbox suites, to test every job on
	// the box path).
	wait bool
}

func (c BoxConfig) withDefaults() BoxConfig {
	c.MaxJobs = cmp.Or(c.MaxJobs, BoxMaxJobsDefault)
	c.MaxAge = cmp.Or(c.MaxAge, BoxMaxAgeDefault)
	c.Max = cmp.Or(c.Max, BoxMaxDefault)
	c.Neutral = cmp.Or(c.Neutral, BoxNeutralDefault)
	c.UIDStart = cmp.Or(c.UIDStart, BoxUIDStartDefault)
	c.Ranges = cmp.Or(c.Ranges, BoxRangesDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c BoxConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.MaxJobs < 1 || c.Max < 1 || c.Neutral < 0 || c.MaxAge <= 0 {
		errs = append(errs, fmt.Errorf("sandbox: boxes: MaxJobs %d, Max %d and MaxAge %s must be positive, Neutral %d not negative", c.MaxJobs, c.Max, c.MaxAge, c.Neutral))
	}
	if c.UIDStart < 1<<20 || c.Ranges < 1 || int64(c.UIDStart)+int64(c.Ranges)*boxUIDRange > 1<<32-2 {
		errs = append(errs, fmt.Errorf("sandbox: boxes: UIDStart %d with %d ranges of %d must stay within 2^20 .. 2^32-2", c.UIDStart, c.Ranges, boxUIDRange))
	}
	return errors.Join(errs...)
}

// BoxStats are the boxes' figures.
type BoxStats struct {
	// Idle counts idle boxes that served a job, Neutral the boxes no job
	// used yet, Live every box (busy ones too).
	Idle, Neutral, Live int
	// Hits: jobs that found an idle box of theirs (of their class, or of
	// their tenant's dedicated boxes); Claims: jobs that took a neutral
	// box; Misses: jobs that found neither and ran in a container of their
	// own.
	Hits, Claims, Misses, Retired int64
	// Prepared: jobs that found their inner sandbox made ahead of them;
	// Discarded: prepared sandboxes discarded because the job that came
	// had other limits or a network.
	Prepared, Discarded int64
	// IdleMemory is the memory the idle and neutral boxes' cgroups hold
	// (their supervisors, the preloaded interpreter, a sandbox made ahead),
	// in bytes.
	IdleMemory int64
}
