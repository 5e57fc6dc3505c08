package jail

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/sandbox/jobfilter"
)

// concerns are the C test programs (csrc/tests/test_<name>.c) and the
// cases each must pass: a case that stops being run fails the test too.
var concerns = map[string][]string{
	"ns":      {"fresh_namespaces", "session_pid_namespace", "hostname", "zygote_pid_namespaces"},
	"mnt":     {"proc", "masked_and_read_only", "tmpfs_work_and_run", "refuses_bad_params"},
	"net":     {"loopback_and_buffers", "egress_listener"},
	"user":    {"own_namespace", "other_uids_unmapped", "refuses_root", "no_capability_in_the_box"},
	"caps":    {"none_in_any_set", "dropped_after_the_namespace"},
	"seccomp": {"refuses_namespaces_and_mounts", "refuses_a_bad_filter"},
	"rlimits": {"limits_read_back", "zero_is_none"},
	"jail":    {"descriptors_session_and_cwd", "refuses_another_layout"},
	"arena":   {"one_aligned_range", "freed_arena_reused_empty", "earlier_arenas_stay_cpythons", "refuses_bad_calls"},
}

// needs fails (KILN_INTEGRATION=require) or skips a test that cannot run
// here: the cases make namespaces and map users as the host's root.
func needs(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "the jail's tests run as root (namespaces, uid maps); running as uid %d", os.Geteuid())
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Unavailable(t, "gcc builds the jail and its tests: %v", err)
	}
	return gcc
}

// compile builds csrc/tests/<prog>.c with the harness and the library's
// sources into dir.
func compile(t testing.TB, gcc, dir, prog string) string {
	t.Helper()
	srcs, err := filepath.Glob("csrc/*.c")
	if err != nil || len(srcs) == 0 {
		t.Fatalf("the library's sources: %v %v", srcs, err)
	}
	out := filepath.Join(dir, prog)
	args := append([]string{"-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o", out,
		"csrc/tests/" + prog + ".c", "csrc/tests/harness.c"}, srcs...)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("compile %s: %v\n%s", prog, err, b)
	}
	return out
}

// Each concern's effect, checked from inside a job process made as a
// box's is (csrc/tests/harness.h).
func TestConcerns(t *testing.T) {
	gcc := needs(t)
	filter, err := jobfilter.Build()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	filterPath := filepath.Join(dir, "job.bpf")
	if err := os.WriteFile(filterPath, filter, 0o644); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(concerns))
	for name := range concerns {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin := compile(t, gcc, dir, "test_"+name)
			out, err := exec.Command(bin, filterPath).CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Errorf("test_%s: %v", name, err)
			}
			for _, c := range concerns[name] {
				if !slices.Contains(strings.Split(string(out), "\n"), "ok "+c) {
					t.Errorf("case %s did not pass", c)
				}
			}
		})
	}
}

// The library links against libc alone, and only against symbols every
// glibc has had for a decade (the images are Debian's, and may be older
// than the host); it exports its API and nothing else.
func TestLibraryLinksOnlyOldLibcSymbols(t *testing.T) {
	needs(t)
	lib := filepath.Join(t.TempDir(), LibraryName)
	if err := Build(t.Context(), lib); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(libs, []string{"libc.so.6"}) {
		t.Errorf("needs %v; want libc.so.6 alone", libs)
	}
	imported, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range imported {
		if s.Version == "" {
			continue // weak, unversioned (the toolchain's own hooks)
		}
		if !oldGlibc(s.Version) {
			t.Errorf("%s@%s: newer than GLIBC_2.17", s.Name, s.Version)
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported = append(exported, s.Name)
		}
	}
	slices.Sort(exported)
	want := []string{"kj_become", "kj_box_pidns", "kj_box_root", "kj_box_userns", "kj_enter", "kj_job_pidns", "kj_mount", "kj_py_arenas", "kj_unshare"}
	if !slices.Equal(exported, want) {
		t.Errorf("exports %v; want %v", exported, want)
	}
}

// oldGlibc reports whether v is GLIBC_2.17 or older.
func oldGlibc(v string) bool {
	rest, ok := strings.CutPrefix(v, "GLIBC_2.")
	if !ok {
		return false
	}
	minor, err := strconv.Atoi(strings.SplitN(rest, ".", 2)[0])
	return err == nil && minor <= 17
}

// BenchmarkEnter reports what a job's sandbox costs in wall time per job,
// step by step, and the job's user namespace alone (the unshare and its
// three map writes): csrc/tests/bench_enter.c.
func BenchmarkEnter(b *testing.B) {
	gcc := needs(b)
	bin := compile(b, gcc, b.TempDir(), "bench_enter")
	for b.Loop() {
		out, err := exec.Command(bin, "200").CombinedOutput()
		if err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		reportFigures(b, string(out))
	}
}

// reportFigures reports every "name_us value" pair of out as a metric.
func reportFigures(b *testing.B, out string) {
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if !strings.HasSuffix(f[i], "_us") {
			continue
		}
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			b.Fatalf("figure %s: %q", f[i], f[i+1])
		}
		b.ReportMetric(v, fmt.Sprintf("%s/job", strings.TrimSuffix(f[i], "_us")+"-µs"))
	}
}

// The Python binding (deploy/images/python/jail.py) lays struct kj_job out
// as the C compiler does, field by field, and speaks its ABI version.
func TestPythonBindingLayout(t *testing.T) {
	gcc := needs(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.Unavailable(t, "python3 loads the binding: %v", err)
	}
	c, err := exec.Command(compile(t, gcc, t.TempDir(), "layout")).Output()
	if err != nil {
		t.Fatal(err)
	}
	const script = `
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import jail
for name, _ in jail.Job._fields_:
    print(name, getattr(jail.Job, name).offset)
print("sizeof", ctypes.sizeof(jail.Job))
print("abi", jail.ABI)
`
	p, err := exec.Command(py, "-B", "-c", script, filepath.Join("..", "..", "deploy", "images", "python")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, p)
	}
	if string(p) != string(c) {
		t.Errorf("the Python binding's layout:\n%s\nthe C compiler's:\n%s", p, c)
	}
}

// A Python interpreter that called kj_py_arenas through the binding keeps
// the objects it makes from then on in one mapping that starts at a 2 MiB
// boundary (what box.py's huge_pages can back with huge pages), save the
// few that fill arenas it had already; the objects it made before stay
// where they were.
func TestPythonObjectsInTheArenaRange(t *testing.T) {
	needs(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.Unavailable(t, "python3 loads the binding: %v", err)
	}
	lib := filepath.Join(t.TempDir(), LibraryName)
	if err := Build(t.Context(), lib); err != nil {
		t.Fatal(err)
	}
	const script = `
import sys
sys.path.insert(0, sys.argv[1])
import jail

def mapping(addr):
    for line in open("/proc/self/maps"):
        a, b = (int(x, 16) for x in line.split()[0].split("-"))
        if a <= addr < b:
            return a, b
    return None

before = [(i, str(i)) for i in range(100000)]
lib = jail.Jail(sys.argv[2], b"\0" * 8, [], [])
lib.py_arenas(64 << 20)
after = [(i, str(i)) for i in range(200000)]  # ~25 MiB of objects
spans = [mapping(id(o)) for o in after[::499]]
start, end = max(set(spans), key=spans.count)
print("range", start, end, sum(1 for s in spans if s == (start, end)), len(spans))
print("before_in_range", sum(1 for o in before[::499] if start <= id(o) < end))
try:
    lib.py_arenas(64 << 20)
except OSError as e:
    print("second", e.errno)
`
	out, err := exec.Command(py, "-B", "-c", script, filepath.Join("..", "..", "deploy", "images", "python"), lib).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
	var start, end uint64
	var in, sampled, before, second int
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("want three lines")
	}
	if _, err := fmt.Sscanf(lines[0], "range %d %d %d %d", &start, &end, &in, &sampled); err != nil {
		t.Fatal(err)
	}
	if start%(2<<20) != 0 || end-start < 64<<20 {
		t.Errorf("most objects made after the call lie in %#x-%#x, not in a 64 MiB range from a 2 MiB boundary", start, end)
	}
	if in < sampled*9/10 {
		t.Errorf("%d of %d objects made after the call lie in the range", in, sampled)
	}
	if _, err := fmt.Sscanf(lines[1], "before_in_range %d", &before); err != nil || before != 0 {
		t.Errorf("%d objects made before the call are in the range (%v)", before, err)
	}
	if _, err := fmt.Sscanf(lines[2], "second %d", &second); err != nil || second != 22 {
		t.Errorf("a second call: %q, want EINVAL (22)", lines[2])
	}
}
