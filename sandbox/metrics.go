package sandbox

import (
	"fmt"
	"strings"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kilnrun/kiln/sandbox/outcome"
)

// usage is what a job used (package outcome judges it).
type usage = outcome.Usage

// decodeMetrics reads the typed Any that task.Metrics returns: cgroup v1 or v2
// metrics depending on the host's cgroup mode.
func decodeMetrics(a *anypb.Any) (usage, error) {
	if a == nil {
		return usage{}, fmt.Errorf("decode metrics: no data")
	}
	name := a.GetTypeUrl()
	name = name[strings.LastIndexByte(name, '/')+1:]
	switch name {
	case "io.containerd.cgroups.v1.Metrics":
		var m v1.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return usage{}, fmt.Errorf("decode cgroup v1 metrics: %w", err)
		}
		return decodeV1(&m), nil
	case "io.containerd.cgroups.v2.Metrics":
		var m v2.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return usage{}, fmt.Errorf("decode cgroup v2 metrics: %w", err)
		}
		return decodeV2(&m), nil
	}
	return usage{}, fmt.Errorf("decode metrics: unknown type %q", a.GetTypeUrl())
}

func decodeV1(m *v1.Metrics) usage {
	var u usage
	u.CPU = time.Duration(m.GetCPU().GetUsage().GetTotal())
	mem := m.GetMemory()
	// memory.max_usage_in_bytes, or memsw's when swap is accounted (it
	// includes swapped-out pages, and the limit we set is on memory+swap).
	u.MemoryPeak = int64(max(mem.GetUsage().GetMax(), mem.GetSwap().GetMax()))
	u.MemoryFailcnt = max(mem.GetUsage().GetFailcnt(), mem.GetSwap().GetFailcnt())
	// oom_kill in memory.oom_control; older shims leave it out, then the
	// outcome falls back on failcnt plus SIGKILL.
	u.OOMKills = m.GetMemoryOomControl().GetOomKill()
	return u
}

// decodeV2 reads cgroup v2 metrics. The peak is memory.peak (max_usage) where
// the kernel (5.19+) and shim provide it; the shims of containerd 1.6 and 1.7
// do not, so the runtime then reads memory.peak from the cgroup itself (see
// host.ReadMemoryPeak). Without either, the best remaining figure is memory.current
// at collection time, a lower bound (the processes are gone, only tmpfs and
// page cache remain charged); when the kernel OOM-killed something the limit
// itself was reached, so the peak is at least the limit.
func decodeV2(m *v2.Metrics) usage {
	var u usage
	u.CPU = time.Duration(m.GetCPU().GetUsageUsec()) * time.Microsecond
	mem := m.GetMemory()
	peak := mem.GetMaxUsage() + mem.GetSwapMaxUsage()
	if mem.GetMaxUsage() == 0 {
		peak = mem.GetUsage() + mem.GetSwapUsage()
		u.PeakEstimated = true
	}
	u.OOMKills = m.GetMemoryEvents().GetOomKill()
	if u.OOMKills > 0 && mem.GetUsageLimit() > 0 && mem.GetUsageLimit() < 1<<62 {
		peak = max(peak, mem.GetUsageLimit())
	}
	u.MemoryPeak = int64(peak)
	return u
}
