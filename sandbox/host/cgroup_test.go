package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeFiles lays out a fake cgroup tree: name → content.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The files a pooled or recycled sandbox's arm and figures use, in the v1
// layout (a directory per controller) and the v2 one (one directory).
func TestCgroupDirShapes(t *testing.T) {
	const path = "/kiln/kiln-pool-1"
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		writeFiles(t, root, map[string]string{
			"memory" + path + "/memory.usage_in_bytes":           "73400320\n",
			"memory" + path + "/memory.limit_in_bytes":           "4294967296\n",
			"memory" + path + "/memory.memsw.limit_in_bytes":     "4294967296\n",
			"memory" + path + "/memory.max_usage_in_bytes":       "99999999\n",
			"memory" + path + "/memory.oom_control":              "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
			"cpuacct" + path + "/cpuacct.usage":                  "1500000000\n",
			"pids" + path + "/cgroup.procs":                      "41\n42\n",
			"pids" + path + "/pids.max":                          "max\n",
			"memory" + path + "/memory.memsw.max_usage_in_bytes": "1\n",
			"memory" + path + "/memory.failcnt":                  "7\n",
			"pids" + path + "/pids.events":                       "max 3\n",
		})
		cg, err := NewCgroupDir(root, false, path)
		if err != nil {
			t.Fatal(err)
		}
		if u, err := cg.MemoryUsage(); err != nil || u != 73400320 {
			t.Errorf("MemoryUsage = %d, %v", u, err)
		}
		if c, err := cg.CPUUsage(); err != nil || c != 1500*time.Millisecond {
			t.Errorf("CPUUsage = %s, %v", c, err)
		}
		if n, err := cg.OOMKills(); err != nil || n != 2 {
			t.Errorf("OOMKills = %d, %v", n, err)
		}
		if p, m, err := cg.LimitsHit(); err != nil || p != 3 || m != 7 {
			t.Errorf("LimitsHit = %d, %d, %v; want 3, 7", p, m, err)
		}
		if p, err := cg.Procs(); err != nil || len(p) != 2 || p[1] != 42 {
			t.Errorf("Procs = %v, %v", p, err)
		}
		// Lowering: memory first, then memory+swap (which must stay >= memory).
		if err := cg.SetMemoryLimit(256<<20, true); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
			if got := readFile(t, filepath.Join(root, "memory", path, f)); got != "268435456" {
				t.Errorf("%s = %s", f, got)
			}
		}
		if err := cg.SetPidsLimit(64); err != nil || readFile(t, filepath.Join(root, "pids", path, "pids.max")) != "64" {
			t.Errorf("pids.max not set: %v", err)
		}
		if f, err := cg.ResetPeak(); err != nil || f != nil {
			t.Errorf("ResetPeak = %v, %v; want no file on v1", f, err)
		}
		if got := readFile(t, filepath.Join(root, "memory", path, "memory.max_usage_in_bytes")); got != "0" {
			t.Errorf("max_usage_in_bytes after reset = %s", got)
		}
	})
	t.Run("v2", func(t *testing.T) {
		root := t.TempDir()
		writeFiles(t, root, map[string]string{
			path + "/memory.current":  "73400320\n",
			path + "/memory.max":      "max\n",
			path + "/memory.swap.max": "0\n",
			path + "/memory.events":   "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n",
			path + "/cpu.stat":        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
			path + "/cgroup.procs":    "7\n8\n9\n",
			path + "/pids.max":        "max\n",
			path + "/pids.events":     "max 4\n",
		})
		cg, err := NewCgroupDir(root, true, path)
		if err != nil {
			t.Fatal(err)
		}
		if u, err := cg.MemoryUsage(); err != nil || u != 73400320 {
			t.Errorf("MemoryUsage = %d, %v", u, err)
		}
		if c, err := cg.CPUUsage(); err != nil || c != 2500*time.Millisecond {
			t.Errorf("CPUUsage = %s, %v", c, err)
		}
		if n, err := cg.OOMKills(); err != nil || n != 1 {
			t.Errorf("OOMKills = %d, %v", n, err)
		}
		if p, m, err := cg.LimitsHit(); err != nil || p != 4 || m != 5 {
			t.Errorf("LimitsHit = %d, %d, %v; want 4, 5", p, m, err)
		}
		if p, err := cg.Procs(); err != nil || len(p) != 3 {
			t.Errorf("Procs = %v, %v", p, err)
		}
		if err := cg.SetMemoryLimit(256<<20, true); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(root, path, "memory.max")); got != "268435456" {
			t.Errorf("memory.max = %s", got)
		}
		if v, err := cg.ReadInt("", "pids.max"); err != nil || v != -1 {
			t.Errorf(`"max" reads %d, %v; want -1`, v, err)
		}
	})
	if _, err := NewCgroupDir("/sys/fs/cgroup", true, "system.slice:kiln:x"); err == nil {
		t.Error("a systemd slice path must be refused")
	}
}

func TestReadMemoryPeak(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "kiln", "job-1-abcd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("12345678\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, ok := ReadMemoryPeak(root, "/kiln/job-1-abcd"); !ok || v != 12345678 {
		t.Fatalf("readMemoryPeak = %d, %v", v, ok)
	}
	for _, p := range []string{"", "/kiln/missing", "system.slice:kiln:job-1-abcd"} {
		if v, ok := ReadMemoryPeak(root, p); ok {
			t.Errorf("readMemoryPeak(%q) = %d; want not ok", p, v)
		}
	}
	// A path climbing out of the hierarchy stays inside root.
	if _, ok := ReadMemoryPeak(root, "/../../kiln/job-1-abcd"); !ok {
		t.Error("a cleaned path inside root should read")
	}
}

// TestLimitSocketMemoryShapes: on cgroup v1 the job cgroup's TCP bound is
// half its memory limit; on cgroup v2 (no v1 memory hierarchy, no kmem.tcp
// file) nothing is written and nothing fails, since memory.max charges
// socket memory there.
func TestLimitSocketMemoryShapes(t *testing.T) {
	t.Parallel()
	v1 := t.TempDir()
	dir := filepath.Join(v1, "kiln", "job")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "memory.kmem.tcp.limit_in_bytes")
	if err := os.WriteFile(file, []byte("9223372036854771712"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := LimitSocketMemory(v1, "/kiln/job", 64<<20); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != "33554432" {
		t.Errorf("v1 kmem.tcp limit %q; want 33554432 (half of 64 MB)", b)
	}
	v2 := t.TempDir() // a v2 host: /sys/fs/cgroup/memory does not exist
	if err := LimitSocketMemory(filepath.Join(v2, "memory"), "/kiln/job", 64<<20); err != nil {
		t.Errorf("v2: %v; want no error", err)
	}
	if err := LimitSocketMemory(v1, "", 64<<20); err != nil {
		t.Errorf("no cgroups path: %v", err)
	}
}
