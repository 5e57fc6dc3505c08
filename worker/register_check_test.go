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

// Redis down across a refresh, then back empty: the registration that
// failed meanwhile is retried every store probe, not at the next refresh, so
// the runtime is registered again within a few probes of Redis answering.
func TestRuntimeRegisteredSoonAfterStoreCameBack(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	b.start(t, &scriptedRuntime{run: succeed}, func(c *Config) {
		c.RegistryInterval = 4 * time.Second
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
	})
	waitFor(t, 10*time.Second, func() bool { return b.up(t) })
	b.redis.Stop()
	// The fault itself, not a wait for an outcome: Redis stays down across
	// the worker's next refresh, whose registration fails.
	time.Sleep(4100 * time.Millisecond)
	b.redis.RestartEmpty()
	start := time.Now()
	waitFor(t, 5*time.Second, func() bool { return b.up(t) })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("runtime registered again %v after Redis came back; want within a few store probes", d.Round(time.Millisecond))
	}
	t.Logf("runtime registered again %v after Redis came back empty", time.Since(start).Round(time.Millisecond))
}
