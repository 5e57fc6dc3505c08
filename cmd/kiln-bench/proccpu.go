package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// procGroups names the processes a job's CPU is spent in, by command name
// (the kernel's comm, at most 15 bytes), so a saturation row can say where
// its CPU per job went. What no group holds (exited processes whose parent
// did not reap them into its children's count, other work on the host) is
// "other".
var procGroups = []struct {
	name, comm string
	sandbox    bool // counted by the containers' cgroup instead, where it can be read
}{
	{"kiln (API, queue, worker)", "kiln-bench", false},
	{"redis-server", "redis-server", false},
	{"containerd", "containerd", false},
	{"shims", "containerd-shim", false},
	{"sandboxes (python3, kiln-init)", "python3", true},
	{"sandboxes (python3, kiln-init)", "kiln-init", true},
	{"sandboxes (node)", "node", true},
}

// sandboxGroup names the CPU of every container of the bench's containerd
// namespace, read from the namespace's cgroup.
const sandboxGroup = "sandboxes (their cgroups)"

// sandboxCgroupCPU is the CPU every container of the bench's namespace has
// used so far, those removed since included: the hierarchical counter of
// the namespace's cgroup (runc puts a container at /<namespace>/<id>).
// Counted by process instead, a box's CPU would vanish with the box (its
// processes exit, and their reaper, the box's shim, with them). ok is
// false when the counter cannot be read.
func sandboxCgroupCPU() (d time.Duration, ok bool) {
	ns := benchNamespace()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", ns, "cpuacct.usage")); err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(n), err == nil
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ns, "cpu.stat"))
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, found := strings.CutPrefix(strings.TrimSpace(line), "usage_usec "); found {
			n, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// procSnap is the CPU time of every live process of a group, and of the
// children it reaped, by process (pid and start time, so a reused pid is a
// new process).
type procSnap map[procID]procTicks

type procID struct{ pid, start string }

type procTicks struct {
	group string
	cpu   time.Duration
}

// procCPU takes a procSnap of the host now.
func procCPU() procSnap {
	out := procSnap{}
	cg, byCgroup := sandboxCgroupCPU()
	if byCgroup {
		out[procID{pid: "cgroup"}] = procTicks{group: sandboxGroup, cpu: cg}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		comm := s[open+1 : close]
		// Fields after the comm: state is field 3, utime 14, stime 15,
		// cutime 16, cstime 17, starttime 22 (1-based over the whole line).
		fs := strings.Fields(s[close+1:])
		if len(fs) < 20 {
			continue
		}
		var ticks int64
		for _, v := range fs[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		for _, g := range procGroups {
			if comm == g.comm || (len(g.comm) == 15 && strings.HasPrefix(comm, g.comm)) {
				if g.sandbox && byCgroup {
					break
				}
				id := procID{pid: filepath.Base(filepath.Dir(f)), start: fs[19]}
				out[id] = procTicks{group: g.name, cpu: time.Duration(ticks) * 10 * time.Millisecond}
				break
			}
		}
	}
	return out
}

// since is each group's CPU from before to s: what every process alive in
// s spent since before (all of it, for one started since). A process that
// exited meanwhile is in neither unless its parent reaped it into its
// children's count; what it spent is "other" in a split.
func (s procSnap) since(before procSnap) map[string]time.Duration {
	out := map[string]time.Duration{}
	for id, t := range s {
		out[t.group] += max(t.cpu-before[id].cpu, 0)
	}
	return out
}

func cpuSplit(spent map[string]time.Duration, total time.Duration, n int) string {
	return formatSplit(spent, total, n, time.Millisecond, "ms")
}

// cpuSplitMicros is cpuSplit in microseconds, for requests much shorter than jobs.
func cpuSplitMicros(spent map[string]time.Duration, total time.Duration, n int) string {
	return formatSplit(spent, total, n, time.Microsecond, "µs")
}

func formatSplit(spent map[string]time.Duration, total time.Duration, n int, unit time.Duration, unitName string) string {
	type part struct {
		name string
		d    time.Duration
	}
	var parts []part
	var known time.Duration
	for name, d := range spent {
		if d > 0 {
			parts = append(parts, part{name, d})
			known += d
		}
	}
	parts = append(parts, part{"other", max(total-known, 0)})
	slices.SortFunc(parts, func(a, b part) int { return cmp.Compare(b.d, a.d) })
	var sb strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&sb, "%s %.1f %s, ", p.name, float64(p.d)/float64(unit)/float64(n), unitName)
	}
	return strings.TrimSuffix(sb.String(), ", ")
}

// startCPUProfile profiles this process into file until stop is called.
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// startProfiles starts a CPU profile into cpu+suffix and takes the
// allocation profile's base into mem+suffix+".base" (each when its name is
// set); stop ends the CPU profile and writes the allocation profile to
// mem+suffix. The allocation counts are cumulative since the process
// started: `go tool pprof -sample_index=alloc_space -base mem.base mem`
// reads what the measurement allocated.
func startProfiles(cpu, mem, suffix string) (stop func(), err error) {
	writeAllocs := func(file string) {
		runtime.GC() // the profile holds the allocations up to the last GC
		f, err := os.Create(file)
		if err == nil {
			err = pprof.Lookup("allocs").WriteTo(f, 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: allocation profile:", err)
		}
	}
	if mem != "" {
		writeAllocs(mem + suffix + ".base")
	}
	stopCPU := func() {}
	if cpu != "" {
		if stopCPU, err = startCPUProfile(cpu + suffix); err != nil {
			return nil, err
		}
	}
	return func() {
		stopCPU()
		if mem != "" {
			writeAllocs(mem + suffix)
		}
	}, nil
}
