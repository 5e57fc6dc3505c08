package host

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
)

// CgroupDir is a sandbox's cgroup as the host sees it, for what the worker
// reads and writes itself rather than through the shim: the limits armed on a
// pooled sandbox when its job arrives, and the baselines its figures are
// counted from. Both hierarchies are handled: v1 (one directory per
// controller) and v2 (one unified directory). The cgroup file system is the
// kernel's; the sandbox cannot plant links in it.
type CgroupDir struct {
	root string // "/sys/fs/cgroup"
	v2   bool
	path string // the OCI spec's cgroupsPath, "/kiln/<id>"
}

// NewCgroupDir is the group at cgroupsPath (the OCI spec's, a directory
// path: a systemd "slice:prefix:name" is refused) under root.
func NewCgroupDir(root string, v2 bool, cgroupsPath string) (CgroupDir, error) {
	if cgroupsPath == "" || strings.Contains(cgroupsPath, ":") {
		return CgroupDir{}, fmt.Errorf("cgroup path %q is not a directory path", cgroupsPath)
	}
	return CgroupDir{root: root, v2: v2, path: filepath.Clean("/" + cgroupsPath)}, nil
}

// V2 reports whether the group is in the unified (v2) hierarchy.
func (c CgroupDir) V2() bool { return c.v2 }

// file is the path of a controller's file (the controller is ignored on v2).
func (c CgroupDir) file(controller, name string) string {
	if c.v2 {
		return filepath.Join(c.root, c.path, name)
	}
	return filepath.Join(c.root, controller, c.path, name)
}

func (c CgroupDir) write(controller, name, value string) error {
	if err := os.WriteFile(c.file(controller, name), []byte(value), 0); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func (c CgroupDir) ReadInt(controller, name string) (int64, error) {
	b, err := os.ReadFile(c.file(controller, name))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	return v, nil
}

// keyed reads one "key value" line of a flat keyed file (memory.events,
// memory.oom_control, cpu.stat); a missing key reads 0.
func (c CgroupDir) keyed(controller, name, key string) (int64, error) {
	b, err := os.ReadFile(c.file(controller, name))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read %s %s: %w", name, key, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

// MemoryUsage is the memory charged to the group now (memory+swap where
// swap is accounted on v1).
func (c CgroupDir) MemoryUsage() (int64, error) {
	if c.v2 {
		return c.ReadInt("", "memory.current")
	}
	return c.ReadInt("memory", "memory.usage_in_bytes")
}

// CPUUsage is the group's CPU time so far.
func (c CgroupDir) CPUUsage() (time.Duration, error) {
	if c.v2 {
		us, err := c.keyed("", "cpu.stat", "usage_usec")
		return time.Duration(us) * time.Microsecond, err
	}
	ns, err := c.ReadInt("cpuacct", "cpuacct.usage")
	return time.Duration(ns), err
}

// OOMKills is the kernel's count of OOM kills in the group.
func (c CgroupDir) OOMKills() (uint64, error) {
	var n int64
	var err error
	if c.v2 {
		n, err = c.keyed("", "memory.events", "oom_kill")
	} else {
		n, err = c.keyed("memory", "memory.oom_control", "oom_kill")
	}
	return uint64(max(n, 0)), err
}

// LimitsHit is how often the group refused a fork at pids.max (pids.events
// "max", the same file on v1 and v2) and how often its memory reached the
// limit (v2 memory.events "max", v1 memory.failcnt).
func (c CgroupDir) LimitsHit() (pids, memory uint64, err error) {
	p, perr := c.keyed("pids", "pids.events", "max")
	var m int64
	var merr error
	if c.v2 {
		m, merr = c.keyed("", "memory.events", "max")
	} else {
		m, merr = c.ReadInt("memory", "memory.failcnt")
	}
	return uint64(max(p, 0)), uint64(max(m, 0)), errors.Join(perr, merr)
}

// SetOOMScoreAdj writes adj to /proc/<pid>/oom_score_adj of every process
// in the group (raising it needs no privilege; a process gone meanwhile is
// skipped).
func (c CgroupDir) SetOOMScoreAdj(adj int) error {
	pids, err := c.Procs()
	if err != nil {
		return err
	}
	var errs []error
	for _, pid := range pids {
		err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj"), []byte(strconv.Itoa(adj)), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("pid %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// Procs lists the group's processes (host pids).
func (c CgroupDir) Procs() ([]int, error) {
	ctrl := "pids"
	b, err := os.ReadFile(c.file(ctrl, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup.procs: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// SetMemoryLimit lowers (or raises) the memory limit of the group, with
// memory+swap kept equal to it where the host accounts swap (swap). On v1
// the two files must stay ordered (memsw >= memory) at every step.
func (c CgroupDir) SetMemoryLimit(limit int64, swap bool) error {
	v := strconv.FormatInt(limit, 10)
	if c.v2 {
		if err := c.write("", "memory.max", v); err != nil {
			return err
		}
		if swap {
			if err := c.write("", "memory.swap.max", "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	cur, err := c.ReadInt("memory", "memory.limit_in_bytes")
	if err != nil {
		return err
	}
	order := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if limit > cur {
		order[0], order[1] = order[1], order[0]
	}
	for _, f := range order {
		if f == "memory.memsw.limit_in_bytes" && !swap {
			continue
		}
		if err := c.write("memory", f, v); err != nil {
			return err
		}
	}
	return nil
}

// SetPidsLimit sets the group's pids.max.
func (c CgroupDir) SetPidsLimit(n int64) error {
	return c.write("pids", "pids.max", strconv.FormatInt(n, 10))
}

// ResetPeak starts the memory high-water mark afresh, so a pooled sandbox's
// figure is its job's, not the launcher's start-up. On v1 the kernel resets
// max_usage_in_bytes to the current usage on any write. On v2 (Linux 6.12+)
// a write to memory.peak resets the mark seen through that open file only,
// so the file is kept open and read through at the end (ReadPeakFile); nil when
// the kernel cannot reset it, and the peak then includes the time before
// delivery.
func (c CgroupDir) ResetPeak() (*os.File, error) {
	if c.v2 {
		f, err := os.OpenFile(c.file("", "memory.peak"), os.O_RDWR, 0)
		if err != nil {
			return nil, nil
		}
		if _, err := f.WriteString("reset\n"); err != nil {
			f.Close()
			return nil, nil
		}
		return f, nil
	}
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes", "memory.failcnt", "memory.memsw.failcnt"} {
		if err := c.write("memory", f, "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return nil, nil
}

// ReadPeakFile reads memory.peak through the descriptor ResetPeak kept.
func ReadPeakFile(f *os.File) (int64, bool) {
	if f == nil {
		return 0, false
	}
	b := make([]byte, 32)
	n, err := f.ReadAt(b, 0)
	if n == 0 && err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b[:n])), 10, 64)
	return v, err == nil && v > 0
}

// CgroupRoot is where the cgroup hierarchies are mounted on the host: the
// unified one (v2), or one directory per controller (v1).
const CgroupRoot = "/sys/fs/cgroup"

// ReadMemoryPeak reads memory.peak (Linux 5.19+) of a cgroup v2 group given
// its path as written in the OCI spec. The cgroup file system is the
// kernel's, not something the sandbox can plant links in. ok is false when
// the file is missing (older kernel) or unreadable.
func ReadMemoryPeak(root, cgroupsPath string) (peak int64, ok bool) {
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

// Cgroup1MemoryRoot is where cgroup v1's memory hierarchy is mounted.
const Cgroup1MemoryRoot = "/sys/fs/cgroup/memory"

// LimitSocketMemory bounds the TCP socket memory of a sandbox's cgroup to half
// its memory limit on cgroup v1 (half, because past the bound the kernel
// still lets every socket queue a page or so each way, and the sockets a job
// may hold are bounded only by pids × RLIMIT_NOFILE), where socket buffers are not charged to
// memory.limit_in_bytes (cgroup v2 charges them to memory.max by itself) and
// runc no longer sets memory.kmem.tcp.limit_in_bytes. Called after the task
// is created and before it starts. A kernel without the file (v2, or a
// future one that dropped it) is left alone.
// root is the v1 memory hierarchy's mount point (Cgroup1MemoryRoot).
func LimitSocketMemory(root, cgroupsPath string, limit int64) error {
	if cgroupsPath == "" {
		return nil
	}
	p := filepath.Join(root, filepath.Clean("/"+cgroupsPath), "memory.kmem.tcp.limit_in_bytes")
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(p, []byte(strconv.FormatInt(limit/2, 10)), 0); err != nil {
		return fmt.Errorf("bound socket memory: %w", err)
	}
	return nil
}

// CgroupV2 reports whether the host runs the unified hierarchy (cgroup v2).
func CgroupV2() bool { return cgroups.Mode() == cgroups.Unified }

// SwapAccounted reports whether a memory+swap limit can be set. cgroup v2:
// runc turns memory+swap into memory.swap.max and tolerates a host without
// swap accounting. cgroup v1: runc fails the container when memsw files are
// missing (kernel booted without swapaccount), so the limit is left out there
// and memory alone is limited.
func SwapAccounted() bool {
	if cgroups.Mode() == cgroups.Unified {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}
