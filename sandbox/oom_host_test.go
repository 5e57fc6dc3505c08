package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// TestHostOOMScoreAdjOfSandbox: seen from the host, every process in a
// running sandbox's cgroup has oom_score_adj 1000, whatever the job writes to
// its own /proc/self/oom_score_adj. Under runc these are kiln-init and the
// program; under gVisor, gVisor's sentry and its ptrace stubs (gVisor's
// /proc inside the sandbox is its own and reads 0, TestHostileOOMScoreAdj).
func TestHostOOMScoreAdjOfSandbox(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py(`
import time
for v in ("0", "-1000"):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(v)
    except OSError:
        pass
print("written", flush=True)
time.sleep(4)
print("done")
`)
	spec.Limits.TimeoutMS = 20_000
	id := job.NewID()
	written := make(chan struct{})
	var once sync.Once
	base := Request{Output: func(stream string, p []byte) {
		if stream == "stdout" && strings.Contains(string(p), "written") {
			once.Do(func() { close(written) })
		}
	}}
	ctx := t.Context()
	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := rt.Run(ctx, asRun(base, id, spec))
		if err != nil {
			t.Errorf("Run: %v (result %+v)", err, res)
		}
		requireSucceeded(t, res, "written\ndone\n")
	})
	key := waitForContainer(t, rt, id)
	testkit.Closed(t, written, time.Minute, "the program to write its values")
	// Scanned until the sandbox's processes show (a slow host, as the
	// emulated cgroup v2 guest, may take longer to start them).
	seen := 0
	testkit.Poll(20*time.Second, func() bool { seen = scanOOMScoreAdj(t, key); return seen > 0 })
	wg.Wait()
	if seen == 0 {
		t.Fatal("no host process found in the sandbox's cgroup")
	}
	t.Logf("%d host processes in the sandbox's cgroup", seen)
	healthy(t, rt)
}

// scanOOMScoreAdj checks the oom_score_adj of every host process in the
// cgroup named by key (1000; a box's launcher and zygote zygoteOOMScoreAdj) and returns
// how many it saw.
func scanOOMScoreAdj(t *testing.T, key string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	// A box's launcher and zygote (every supervisor but kiln-init) have the
	// zygote's value, set on the launcher before it forked the zygote.
	seen, lowered := 0, 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), key) {
			continue
		}
		adj, err := os.ReadFile(filepath.Join("/proc", e.Name(), "oom_score_adj"))
		if err != nil {
			continue // gone meanwhile
		}
		seen++
		if v := strings.TrimSpace(string(adj)); v == strconv.Itoa(zygoteOOMScoreAdj) && lowered < supervisorsOf(key)-1 {
			lowered++ // a box's zygote or its launcher: less likely victims than its job, ahead of the host
		} else if v != "1000" {
			cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			t.Errorf("host pid %s (%q) in the sandbox's cgroup has oom_score_adj %s; want 1000", e.Name(), strings.ReplaceAll(string(cl), "\x00", " "), v)
		}
	}
	return seen
}
