package sandbox

import (
	"sync"
	"testing"
)

// Sandboxes sharing runc-v2 shims in groups (an option, off by default):
// jobs one after another and at once all run, and nothing is left after.
func TestShimGroups(t *testing.T) {
	if underGVisor() {
		t.Skip("shim groups are for runc sandboxes")
	}
	t.Parallel()
	cfg := setupConfig(t)
	cfg.WorkerID = testWorkerID + "-shims-" + randomHex(3)
	cfg.ShimGroupSize = 3
	rt, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for range 7 {
		requireSucceeded(t, run(t, rt, py("print(1)")), "1\n")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			requireSucceeded(t, run(t, rt, py("print(2)")), "2\n")
		}()
	}
	wg.Wait()
	settle(t, rt)
	if left := leftovers(t, rt, cfg.WorkerID); len(left) > 0 {
		t.Fatalf("left in containerd: %q", left)
	}
}
