package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// usage is what a job used, read from its cgroup after it exited and before
// the task is deleted (deleting the task removes the cgroup).
type usage struct {
	CPU           time.Duration
	MemoryPeak    int64  // bytes; see decodeV2 for when it is a lower bound
	PeakEstimated bool   // MemoryPeak is not the kernel's high-water mark (cgroup v2 without memory.peak in the metrics)
	MemoryFailcnt uint64 // times the memory limit was hit (cgroup v1 only)
	OOMKills      uint64 // processes the kernel OOM-killed in the cgroup
	// Read only for a sandbox that ended without its init's status (see
	// limitsHit): how often the cgroup refused a fork at its pids limit and
	// how often memory hit its limit.
	PidsLimitHits   uint64
	MemoryLimitHits uint64
}

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
// readMemoryPeak). Without either, the best remaining figure is memory.current
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

// cgroup2Root is where the unified hierarchy is mounted on the host.
const cgroup2Root = "/sys/fs/cgroup"

// readMemoryPeak reads memory.peak (Linux 5.19+) of a cgroup v2 group given
// its path as written in the OCI spec. The cgroup file system is the
// kernel's, not something the sandbox can plant links in. ok is false when
// the file is missing (older kernel) or unreadable.
func readMemoryPeak(root, cgroupsPath string) (peak int64, ok bool) {
	if cgroupsPath == "" || strings.Contains(cgroupsPath, ":") {
		return 0, false // empty, or a systemd slice:prefix:name path, not a directory
	}
	b, err := os.ReadFile(filepath.Join(root, filepath.Clean("/"+cgroupsPath), "memory.peak"))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return v, true
}
