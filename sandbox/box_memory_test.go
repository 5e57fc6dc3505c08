package sandbox

import (
	"testing"

	"github.com/kilnrun/kiln/job"
)

// A box job's memory_mb is its own: with 128 MB it allocates 110 MiB of
// its own although its zygote holds the whole preload (more than 128 MB
// itself), its peak_memory is its own figure, and a job that goes past its
// limit is oom_killed.
func TestBoxMemoryIsTheJobs(t *testing.T) {
	t.Parallel()
	rt := setupPreloaded(t)
	// Each imports a preloaded module, so it runs in the preloaded box (a
	// job importing only the standard library runs in a lean one).
	fits := py("import numpy\nb = bytearray(b'x') * (110 << 20)\nprint(len(b) >> 20)")
	fits.Limits.MemoryMB = 128
	res := runAs(t, rt, "acme", fits)
	requireSucceeded(t, res, "110\n")
	if res.MemoryPeakBytes < 110<<20 || res.MemoryPeakBytes > 128<<20 {
		t.Errorf("peak memory %d MiB; want the job's own, between 110 and 128 MiB", res.MemoryPeakBytes>>20)
	}
	var baseline int64
	for _, sb := range rt.box.boxes.Idle() {
		baseline = max(baseline, sb.baseline)
	}
	if baseline <= 128<<20 {
		t.Errorf("the zygote's baseline is %d MiB; want the preload's, over the job's 128 MB", baseline>>20)
	}
	t.Logf("zygote baseline %d MiB, job peak %d MiB", baseline>>20, res.MemoryPeakBytes>>20)

	over := py("import numpy\nb = bytearray(b'x') * (256 << 20)\nprint(len(b))")
	over.Limits.MemoryMB = 128
	if res := runAs(t, rt, "acme", over); res.Status != job.StatusOOMKilled {
		t.Errorf("256 MiB in 128 MB: %s %+v; want oom_killed\n%s", res.Status, res.Error, res.Stderr)
	}
	// The box, or its replacement, serves the next job with its limit.
	requireSucceeded(t, runAs(t, rt, "acme", fits), "110\n")
}

// A session's memory cap is its own too: in a box whose zygote holds the
// whole preload, a 128 MB session keeps 100 MiB of its own across calls,
// and a call that goes past the cap is oom_killed.
func TestSessionMemoryIsItsOwn(t *testing.T) {
	t.Parallel()
	if !testBox() {
		t.Skip("sessions run in boxes")
	}
	cfg := boxConfig(setupConfig(t))
	cfg.Pool.Preload = nil
	cfg.Boxes = BoxConfig{wait: true}
	cfg.Images = map[string]string{"python": "kiln.local/python:" + recipeHash(t, "python")[:12]}
	cfg.Isolation = testIsolationOverride(cfg.Images)
	rt := startRuntime(t, cfg)
	s := openSession(t, rt, "acme", 128)
	res, _ := call(t, s, "import pandas, matplotlib.pyplot\nb = bytearray(b'x') * (100 << 20)", job.Limits{})
	mustSucceed(t, res, "")
	res, _ = call(t, s, "print(len(b) >> 20)", job.Limits{})
	mustSucceed(t, res, "100")
	res, _ = call(t, s, "c = bytearray(b'x') * (256 << 20)", job.Limits{})
	if res.Status != job.StatusOOMKilled {
		t.Errorf("a call past the session's cap: %s %+v; want oom_killed", res.Status, res.Error)
	}
}
