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
var procGroups = []struct{ name, comm string }{
	{"kiln (API, queue, worker)", "kiln-bench"},
	{"redis-server", "redis-server"},
	{"containerd", "containerd"},
	{"shims", "containerd-shim"},
	{"sandboxes (python3, kiln-init)", "python3"},
	{"sandboxes (python3, kiln-init)", "kiln-init"},
	{"sandboxes (node)", "node"},
}

// procCPU sums, per group, the CPU time of every live process of the group
// and of the children it reaped.
func procCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
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
		// cutime 16, cstime 17 (1-based over the whole line).
		fs := strings.Fields(s[close+1:])
		if len(fs) < 15 {
			continue
		}
		var ticks int64
		for _, v := range fs[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		for _, g := range procGroups {
			if comm == g.comm || (len(g.comm) == 15 && strings.HasPrefix(comm, g.comm)) {
				out[g.name] += time.Duration(ticks) * 10 * time.Millisecond
				break
			}
		}
	}
	return out
}

// cpuSplit prints, per group, the CPU per job spent between two procCPU
// snapshots around n jobs that used total host CPU.
func cpuSplit(before, after map[string]time.Duration, total time.Duration, n int) string {
	return formatSplit(before, after, total, n, time.Millisecond, "ms")
}

// cpuSplitMicros is cpuSplit in microseconds, for requests much shorter than jobs.
func cpuSplitMicros(before, after map[string]time.Duration, total time.Duration, n int) string {
	return formatSplit(before, after, total, n, time.Microsecond, "µs")
}

func formatSplit(before, after map[string]time.Duration, total time.Duration, n int, unit time.Duration, unitName string) string {
	type part struct {
		name string
		d    time.Duration
	}
	var parts []part
	var known time.Duration
	for name, d := range after {
		// A process that started during the window counts from zero; one
		// that ended is gone from both (its reaper's children's count has
		// it, when its reaper lives).
		d -= before[name]
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
