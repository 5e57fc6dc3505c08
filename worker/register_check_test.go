package worker

import (
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
)

// Redis restarted without its data: the worker registers its runtime again
// within a few store probes, not at its next refresh (RegistryInterval, an
// hour here), so the API does not refuse submissions for the runtime.
func TestRuntimeRegisteredAgainAfterStoreLostIt(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	b.start(t, &scriptedRuntime{run: succeed}, func(c *Config) {
		c.RegistryInterval = time.Hour
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
	})
	waitFor(t, 10*time.Second, func() bool { return b.up(t) })
	b.redis.RestartEmpty()
	start := time.Now()
	waitFor(t, 5*time.Second, func() bool { return b.up(t) })
	t.Logf("runtime registered again %v after Redis restarted empty", time.Since(start).Round(time.Millisecond))
}
