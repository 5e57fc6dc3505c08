package sandbox

import (
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
)

// BenchmarkBoxJob runs print(1) jobs one after the other in one box
// preloaded as in production (the image's preload list) and reports, per
// job, the CPU the box's cgroup used (the zygote, each job's fork and
// sandbox, the job) and the latency's median: the box path's own cost,
// which host-wide figures (kiln-bench's) mix with whatever else the host
// runs. go test -run '^$' -bench BoxJob ./sandbox/
func BenchmarkBoxJob(b *testing.B) {
	cfg := setupConfig(b)
	cfg.WorkerID = testWorkerID + "-bench-" + randomHex(3)
	cfg.Boxes = BoxConfig{wait: true, Max: 1, Neutral: 1}
	rt := startRuntime(b, cfg)
	spec := job.Spec{Runtime: "python", Code: "print(1)", Cache: job.CacheOff()}
	for range 20 { // the box claimed, its next sandbox made ahead
		requireSucceeded(b, runAs(b, rt, "acme", spec), "1\n")
	}
	var sb *sandbox
	if idle := rt.box.boxes.Idle(); len(idle) > 0 {
		sb = idle[0]
	}
	if sb == nil {
		b.Fatal("no idle box after the warm-up")
	}
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		b.Fatal(err)
	}
	cpu0, err := cg.CPUUsage()
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		res := runAs(b, rt, "acme", spec)
		lat = append(lat, time.Since(t0))
		if res.Status != job.StatusSucceeded {
			b.Fatalf("%s %+v", res.Status, res.Error)
		}
	}
	b.StopTimer()
	// The last job's next sandbox is made once its result is back.
	requireSucceeded(b, runAs(b, rt, "acme", spec), "1\n")
	cpu1, err := cg.CPUUsage()
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	n := len(lat)
	b.ReportMetric(float64(cpu1-cpu0)/float64(n+1)/1e6, "box-cpu-ms/job")
	b.ReportMetric(float64(lat[n/2])/1e6, "p50-ms")
}
