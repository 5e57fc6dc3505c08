package worker

import (
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
)

// Redis restarted without its data: the worker registers its runtime again
// within a few store probes, not at its next refresh (RegistryInterval, an
// hour here), so the API does not refuse submissions for the runtime.
func TestRuntimeRegisteredAgainAfterStoreLostIt(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	b.start(t, &testkit.Runtime{Script: testkit.Succeed}, func(c *Config) {
		c.RegistryInterval = time.Hour
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
	})
	testkit.Eventually(t, 10*time.Second, "the first registration", func() bool { return b.up(t) })
	b.redis.RestartEmpty()
	start := time.Now()
	testkit.Eventually(t, 5*time.Second, "the registration again", func() bool { return b.up(t) })
	t.Logf("runtime registered again %v after Redis restarted empty", time.Since(start).Round(time.Millisecond))
}

// Redis down across a refresh, then back empty: the registration that
// failed meanwhile is retried every store probe, not at the next refresh, so
// the runtime is registered again within a few probes of Redis answering.
// The refresh is on the worker's clock, which the test moves: no refresh
// comes after the failed one, so only the probes can register again.
func TestRuntimeRegisteredSoonAfterStoreCameBack(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	clock := testkit.NewClock(time.Time{})
	sig := newSignals()
	b.start(t, &testkit.Runtime{Script: testkit.Succeed}, func(c *Config) {
		c.RegistryInterval = 4 * time.Second
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
		c.Clock = clock
		c.Hooks = sig.hooks()
	})
	if e := testkit.Receive(t, sig.registered, 10*time.Second, "the first registration"); e.Err != nil {
		t.Fatalf("first registration: %v", e.Err)
	}
	b.redis.Stop()
	// The fault itself: Redis is down at the worker's next refresh, whose
	// registration fails.
	clock.Advance(4 * time.Second)
	if e := testkit.Receive(t, sig.registered, 10*time.Second, "the refresh with Redis down"); e.Err == nil {
		t.Fatal("the refresh registered the runtime with Redis down")
	}
	b.redis.RestartEmpty()
	start := time.Now()
	testkit.Eventually(t, 5*time.Second, "the registration again", func() bool { return b.up(t) })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("runtime registered again %v after Redis came back; want within a few store probes", d.Round(time.Millisecond))
	}
	t.Logf("runtime registered again %v after Redis came back empty", time.Since(start).Round(time.Millisecond))
}
