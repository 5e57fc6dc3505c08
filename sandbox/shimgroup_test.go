package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/kilnrun/kiln/job"
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

// Members of one shim group are served by one shim: their containers carry
// the group's annotation and their tasks' init processes have the same
// parent. A sandbox of its own (grouping off) carries none.
func TestShimGroupMembersShareAShim(t *testing.T) {
	if underGVisor() {
		t.Skip("shim groups are for runc sandboxes")
	}
	t.Parallel()
	for _, size := range []int{3, 1} {
		cfg := setupConfig(t)
		cfg.WorkerID = testWorkerID + "-shimshare-" + randomHex(3)
		cfg.ShimGroupSize = size
		rt := startRuntime(t, cfg)
		ctx := namespacesCtx(t, rt)
		img, err := rt.images.resolve(ctx, "python")
		if err != nil {
			t.Fatal(err)
		}
		var groups, parents []string
		for range 2 {
			sb, err := rt.ct.prepare(ctx, img, prepOpts{jobID: job.NewID(), lim: job.DefaultLimits})
			t.Cleanup(func() { cleanup(context.WithoutCancel(ctx), sb) })
			if err != nil {
				t.Fatal(err)
			}
			spec, err := sb.container.Spec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			groups = append(groups, spec.Annotations[ctrd.ShimGroupAnnotation])
			parents = append(parents, parentPid(t, int(sb.task.Pid())))
		}
		if size > 1 && (groups[0] == "" || groups[0] != groups[1] || parents[0] != parents[1]) {
			t.Errorf("group size %d: groups %q, shim pids %q; want one group, one shim", size, groups, parents)
		}
		if size == 1 && (groups[0] != "" || groups[1] != "" || parents[0] == parents[1]) {
			t.Errorf("no grouping: groups %q, shim pids %q; want none, a shim each", groups, parents)
		}
	}
}

// parentPid is host process pid's parent, as /proc says.
func parentPid(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...: comm may hold spaces, so count from ")".
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return f[1]
}
