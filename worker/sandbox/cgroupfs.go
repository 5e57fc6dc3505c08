package sandbox

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
)

// cgroupDir is a sandbox's cgroup as the host sees it, for what the worker
// reads and writes itself rather than through the shim: the limits armed on a
// pooled sandbox when its job arrives, and the baselines its figures are
// counted from. Both hierarchies are handled: v1 (one directory per
// controller) and v2 (one unified directory). The cgroup file system is the
// kernel's; the sandbox cannot plant links in it.
type cgroupDir struct {
	root string // "/sys/fs/cgroup"
	v2   bool
	path string // the OCI spec's cgroupsPath, "/kiln/<id>"
}

func newCgroupDir(root string, v2 bool, cgroupsPath string) (cgroupDir, error) {
	if cgroupsPath == "" || strings.Contains(cgroupsPath, ":") {
		return cgroupDir{}, fmt.Errorf("cgroup path %q is not a directory path", cgroupsPath)
	}
	return cgroupDir{root: root, v2: v2, path: filepath.Clean("/" + cgroupsPath)}, nil
}

// file is the path of a controller's file (the controller is ignored on v2).
func (c cgroupDir) file(controller, name string) string {
	if c.v2 {
		return filepath.Join(c.root, c.path, name)
	}
	return filepath.Join(c.root, controller, c.path, name)
}

func (c cgroupDir) write(controller, name, value string) error {
	if err := os.WriteFile(c.file(controller, name), []byte(value), 0); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func (c cgroupDir) readInt(controller, name string) (int64, error) {
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
func (c cgroupDir) keyed(controller, name, key string) (int64, error) {
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

// memoryUsage is the memory charged to the group now (memory+swap where
// swap is accounted on v1).
func (c cgroupDir) memoryUsage() (int64, error) {
	if c.v2 {
		return c.readInt("", "memory.current")
	}
	return c.readInt("memory", "memory.usage_in_bytes")
}

// cpuUsage is the group's CPU time so far.
func (c cgroupDir) cpuUsage() (time.Duration, error) {
	if c.v2 {
		us, err := c.keyed("", "cpu.stat", "usage_usec")
		return time.Duration(us) * time.Microsecond, err
	}
	ns, err := c.readInt("cpuacct", "cpuacct.usage")
	return time.Duration(ns), err
}

// oomKills is the kernel's count of OOM kills in the group.
func (c cgroupDir) oomKills() (uint64, error) {
	var n int64
	var err error
	if c.v2 {
		n, err = c.keyed("", "memory.events", "oom_kill")
	} else {
		n, err = c.keyed("memory", "memory.oom_control", "oom_kill")
	}
	return uint64(max(n, 0)), err
}

// limitsHit is how often the group refused a fork at pids.max (pids.events
// "max", the same file on v1 and v2) and how often its memory reached the
// limit (v2 memory.events "max", v1 memory.failcnt).
func (c cgroupDir) limitsHit() (pids, memory uint64, err error) {
	p, perr := c.keyed("pids", "pids.events", "max")
	var m int64
	var merr error
	if c.v2 {
		m, merr = c.keyed("", "memory.events", "max")
	} else {
		m, merr = c.readInt("memory", "memory.failcnt")
	}
	return uint64(max(p, 0)), uint64(max(m, 0)), errors.Join(perr, merr)
}

// setOOMScoreAdj writes adj to /proc/<pid>/oom_score_adj of every process
// in the group (raising it needs no privilege; a process gone meanwhile is
// skipped).
func (c cgroupDir) setOOMScoreAdj(adj int) error {
	pids, err := c.procs()
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

// procs lists the group's processes (host pids).
func (c cgroupDir) procs() ([]int, error) {
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

// setMemoryLimit lowers (or raises) the memory limit of the group, with
// memory+swap kept equal to it where the host accounts swap (swap). On v1
// the two files must stay ordered (memsw >= memory) at every step.
func (c cgroupDir) setMemoryLimit(limit int64, swap bool) error {
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
	cur, err := c.readInt("memory", "memory.limit_in_bytes")
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

func (c cgroupDir) setPidsLimit(n int64) error {
	return c.write("pids", "pids.max", strconv.FormatInt(n, 10))
}

// resetPeak starts the memory high-water mark afresh, so a pooled sandbox's
// figure is its job's, not the launcher's start-up. On v1 the kernel resets
// max_usage_in_bytes to the current usage on any write. On v2 (Linux 6.12+)
// a write to memory.peak resets the mark seen through that open file only,
// so the file is kept open and read through at the end (peakFile); nil when
// the kernel cannot reset it, and the peak then includes the time before
// delivery.
func (c cgroupDir) resetPeak() (*os.File, error) {
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

// readPeakFile reads memory.peak through the descriptor resetPeak kept.
func readPeakFile(f *os.File) (int64, bool) {
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

// processCPU is a host process's user+system CPU time so far, from
// /proc/<pid>/stat (clock ticks of 1/100 s, USER_HZ on every Linux ABI).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat of %d: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat of %d: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat of %d: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
