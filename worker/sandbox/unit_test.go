package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/worker/sandbox/initproto"
)

func TestOutcome(t *testing.T) {
	t.Parallel()
	const limit = 64 << 20
	exited := func(code int) *initproto.Status { return &initproto.Status{Ready: true, ExitCode: code} }
	killed := func(sig syscall.Signal) *initproto.Status { return &initproto.Status{Ready: true, Signal: int(sig)} }
	tests := []struct {
		name     string
		e        ending
		status   job.Status
		category job.Category // "" for success
		signal   string
		exit     int // -1: none
		msg      string
	}{
		{"success", ending{Init: exited(0)}, job.StatusSucceeded, "", "", 0, ""},
		{"exit code", ending{Init: exited(3), StderrTail: []byte("boom\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 3, "code 3: boom"},
		{"exit code is never a signal", ending{Init: exited(152)}, job.StatusFailed, job.CategoryRuntimeError, "", 152, "code 152"},
		{"exit 137 is an exit code", ending{Init: exited(137), MemoryLimit: limit, Usage: usage{MemoryPeak: limit}}, job.StatusFailed, job.CategoryRuntimeError, "", 137, ""},
		{"exception", ending{Init: exited(1), StderrTail: []byte("Traceback (most recent call last):\n  File \"/work/main.py\", line 1\nZeroDivisionError: division by zero\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "ZeroDivisionError"},
		{"syntax", ending{Init: exited(1), StderrTail: []byte("  File \"/work/main.py\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, "never closed"},
		{"indentation", ending{Init: exited(1), StderrTail: []byte("IndentationError: unexpected indent\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, ""},
		{"tab", ending{Init: exited(1), StderrTail: []byte("TabError: inconsistent use of tabs\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, ""},
		{"syntax mentioned mid-traceback is not a syntax error", ending{Init: exited(1), StderrTail: []byte("SyntaxError: x\nValueError: y\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "ValueError"},
		{"missing module", ending{Init: exited(1), Runtime: "python", ImageName: "kiln.local/python:latest", StderrTail: []byte("ModuleNotFoundError: No module named 'torch.nn'\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, `module "torch" is not installed in the python runtime's image`},
		{"timeout", ending{TimedOut: true, Timeout: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "1s"},
		{"timeout wins over oom figures", ending{TimedOut: true, MemoryLimit: limit, Usage: usage{OOMKills: 1}}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, ""},
		{"init's own timeout", ending{Init: &initproto.Status{Ready: true, TimedOut: true, Signal: 9}, Timeout: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "1s"},
		{"canceled", ending{Canceled: true}, job.StatusCanceled, job.CategoryCanceled, "SIGKILL", -1, ""},
		{"oom counter", ending{Init: killed(syscall.SIGKILL), MemoryLimit: limit, Usage: usage{OOMKills: 1}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "SIGKILL", -1, "64 MB"},
		{"oom counter with a child killed", ending{Init: exited(1), MemoryLimit: limit, Usage: usage{OOMKills: 2}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", 1, ""},
		{"oom kill of the init itself", ending{InitErr: errors.New("no status was written"), MemoryLimit: limit, Usage: usage{OOMKills: 1}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", -1, ""},
		{"no status after the memory limit was hit", ending{InitErr: errors.New("no status was written"), MemoryLimit: limit, Usage: usage{MemoryLimitHits: 3}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", -1, "64 MB"},
		{"no status after forks were refused at the pids limit", ending{InitErr: errors.New("no status was written"), Usage: usage{PidsLimitHits: 40}}, job.StatusFailed, job.CategoryRuntimeError, "", -1, "limit of processes"},
		{"no status and no limit hit is the platform's", ending{InitErr: errors.New("no status was written")}, job.StatusInternalError, job.CategoryInternal, "", -1, "no status"},
		{"limit counters do not judge a reported ending", ending{Init: exited(0), Usage: usage{PidsLimitHits: 40, MemoryLimitHits: 3}}, job.StatusSucceeded, "", "", 0, ""},
		{"self sigkill at the memory limit is not oom", ending{Init: killed(syscall.SIGKILL), MemoryLimit: limit, Usage: usage{MemoryFailcnt: 5, MemoryPeak: limit}}, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1, "SIGKILL"},
		{"a MemoryError line is not oom", ending{Init: exited(1), MemoryLimit: limit, StderrTail: []byte("Traceback...\nMemoryError\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "MemoryError"},
		{"segfault", ending{Init: killed(syscall.SIGSEGV)}, job.StatusFailed, job.CategoryRuntimeError, "SIGSEGV", -1, "SIGSEGV"},
		{"abort", ending{Init: killed(syscall.SIGABRT)}, job.StatusFailed, job.CategoryRuntimeError, "SIGABRT", -1, "SIGABRT"},
		{"cpu limit soft", ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 1_000_000}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGXCPU", -1, "CPU"},
		{"cpu limit seen by the cgroup on a lagging host", ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 700_000}, Usage: usage{CPU: 921 * time.Millisecond}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGXCPU", -1, "CPU"},
		{"self-sent SIGXCPU is not the cpu limit", ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 30_000}, CPULimit: time.Second}, job.StatusFailed, job.CategoryRuntimeError, "SIGXCPU", -1, "SIGXCPU"},
		{"SIGXCPU without a cpu limit", ending{Init: killed(syscall.SIGXCPU)}, job.StatusFailed, job.CategoryRuntimeError, "SIGXCPU", -1, "SIGXCPU"},
		{"cpu limit hard", ending{Init: &initproto.Status{Ready: true, Signal: 9, CPUMicros: 2_000_000}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "CPU"},
		{"sigkill below the cpu limit", ending{Init: &initproto.Status{Ready: true, Signal: 9, CPUMicros: 100_000}, CPULimit: time.Second}, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1, "SIGKILL"},
		{"launcher fault before readiness", ending{Init: &initproto.Status{ExitCode: 125}, StderrTail: []byte("kiln-launcher: stdin closed before a job header arrived\n")}, job.StatusInternalError, job.CategoryInternal, "", 125, "launcher"},
		{"launcher-looking line from the program", ending{Init: exited(125), StderrTail: []byte("kiln-launcher: job frame is not valid\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 125, "code 125"},
		{"no init status", ending{InitErr: initproto.ErrForged}, job.StatusInternalError, job.CategoryInternal, "", -1, "nonce"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.e.Classifier = classifiers["python"] // these endings are CPython's
			status, f, code, sig := outcome(tt.e)
			if status != tt.status || sig != tt.signal {
				t.Fatalf("status %s signal %q; want %s %q", status, sig, tt.status, tt.signal)
			}
			gotExit := -1
			if code != nil {
				gotExit = *code
			}
			if gotExit != tt.exit {
				t.Errorf("exit code %d; want %d", gotExit, tt.exit)
			}
			if tt.category == "" {
				if f != nil {
					t.Fatalf("failure %+v; want none", f)
				}
				return
			}
			if f == nil || f.Category != tt.category || f.Retryable != tt.category.Retryable() {
				t.Fatalf("failure %+v; want category %s", f, tt.category)
			}
			if !strings.Contains(f.Message, tt.msg) {
				t.Errorf("message %q does not contain %q", f.Message, tt.msg)
			}
		})
	}
}

func TestDecodeMetricsV1(t *testing.T) {
	t.Parallel()
	a, err := anypb.New(&v1.Metrics{
		CPU: &v1.CPUStat{Usage: &v1.CPUUsage{Total: 1_500_000_000}},
		Memory: &v1.MemoryStat{
			Usage: &v1.MemoryEntry{Max: 40 << 20, Failcnt: 3},
			Swap:  &v1.MemoryEntry{Max: 42 << 20},
		},
		MemoryOomControl: &v1.MemoryOomControl{OomKill: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	u, err := decodeMetrics(a)
	if err != nil {
		t.Fatal(err)
	}
	want := usage{CPU: 1500 * time.Millisecond, MemoryPeak: 42 << 20, MemoryFailcnt: 3, OOMKills: 1}
	if u != want {
		t.Fatalf("got %+v; want %+v", u, want)
	}
}

func TestDecodeMetricsV2(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		m    *v2.Metrics
		want usage
	}{
		{"with memory.peak", &v2.Metrics{
			CPU:    &v2.CPUStat{UsageUsec: 250_000},
			Memory: &v2.MemoryStat{Usage: 1 << 20, MaxUsage: 30 << 20, UsageLimit: 64 << 20},
		}, usage{CPU: 250 * time.Millisecond, MemoryPeak: 30 << 20}},
		{"without memory.peak: current usage is the floor", &v2.Metrics{
			CPU:    &v2.CPUStat{UsageUsec: 1000},
			Memory: &v2.MemoryStat{Usage: 5 << 20, UsageLimit: 64 << 20},
		}, usage{CPU: time.Millisecond, MemoryPeak: 5 << 20, PeakEstimated: true}},
		{"oom kill without memory.peak: the limit was reached", &v2.Metrics{
			Memory:       &v2.MemoryStat{Usage: 1 << 20, UsageLimit: 64 << 20},
			MemoryEvents: &v2.MemoryEvents{Max: 10, Oom: 1, OomKill: 1},
		}, usage{MemoryPeak: 64 << 20, OOMKills: 1, PeakEstimated: true}},
		{"unlimited stays unlimited", &v2.Metrics{
			Memory:       &v2.MemoryStat{Usage: 1 << 20, UsageLimit: 1<<63 - 1},
			MemoryEvents: &v2.MemoryEvents{OomKill: 1},
		}, usage{MemoryPeak: 1 << 20, OOMKills: 1, PeakEstimated: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := anypb.New(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			u, err := decodeMetrics(a)
			if err != nil {
				t.Fatal(err)
			}
			if u != tt.want {
				t.Fatalf("got %+v; want %+v", u, tt.want)
			}
		})
	}
}

func TestDecodeMetricsUnknown(t *testing.T) {
	t.Parallel()
	if _, err := decodeMetrics(&anypb.Any{TypeUrl: "example.com/Other"}); err == nil {
		t.Fatal("want an error for an unknown metrics type")
	}
	if _, err := decodeMetrics(nil); err == nil {
		t.Fatal("want an error for no metrics")
	}
}

func TestCappedBuffer(t *testing.T) {
	t.Parallel()
	c := newCappedBuffer(10)
	for range 1000 {
		if n, err := c.Write([]byte("0123456789abcdef\n")); n != 17 || err != nil {
			t.Fatalf("Write = %d, %v; want all bytes accepted", n, err)
		}
	}
	kept, total, trunc := c.Bytes()
	if string(kept) != "0123456789" || total != 17000 || !trunc {
		t.Fatalf("kept %q total %d truncated %v", kept, total, trunc)
	}
	if tail := c.Tail(); len(tail) != tailBytes || !bytes.HasSuffix(tail, []byte("abcdef\n")) {
		t.Fatalf("tail is %d bytes ending %q", len(tail), tail[max(0, len(tail)-10):])
	}
	big := bytes.Repeat([]byte("y"), 3*tailBytes)
	big = append(big, "END"...)
	c.Write(big)
	if tail := c.Tail(); len(tail) != tailBytes || !bytes.HasSuffix(tail, []byte("yEND")) {
		t.Fatalf("tail after a big write: %d bytes", len(tail))
	}
	small := newCappedBuffer(100)
	small.Write([]byte("hi"))
	if kept, total, trunc := small.Bytes(); string(kept) != "hi" || total != 2 || trunc {
		t.Fatalf("small: %q %d %v", kept, total, trunc)
	}
}

func TestEncodeFrame(t *testing.T) {
	t.Parallel()
	spec := job.Spec{Code: "print(1)", Files: []job.File{{Name: "a/b.bin", Content: "AAEC", Encoding: "base64"}, {Name: "t.txt", Content: "hé"}}}
	frame, err := encodeFrame(spec)
	if err != nil {
		t.Fatal(err)
	}
	head, body, ok := bytes.Cut(frame, []byte("\n"))
	if !ok || !bytes.HasPrefix(head, []byte("KILN/1 ")) {
		t.Fatalf("frame header %q", head)
	}
	var n int
	if _, err := fmt.Sscan(string(head[len("KILN/1 "):]), &n); err != nil || n != len(body) {
		t.Fatalf("header length %q vs body %d", head, len(body))
	}
	var got struct {
		Code  string            `json:"code"`
		Args  []string          `json:"args"`
		Env   map[string]string `json:"env"`
		Files []struct {
			Name string `json:"name"`
			Data []byte `json:"data"`
		} `json:"files"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Code != "print(1)" || got.Args == nil || got.Env == nil || len(got.Files) != 2 ||
		!bytes.Equal(got.Files[0].Data, []byte{0, 1, 2}) || string(got.Files[1].Data) != "hé" {
		t.Fatalf("decoded frame %+v", got)
	}
	if _, err := encodeFrame(job.Spec{Code: "x", Files: []job.File{{Name: "f", Content: "!!", Encoding: "base64"}}}); err == nil {
		t.Fatal("bad base64 must be an error")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	bad := Config{CPUs: -1, WorkerID: "a b", Images: map[string]string{"python": ""}}
	err := bad.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{"CPUs", "WorkerID", "Images"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	c := Config{}.withDefaults()
	if c.Namespace != "kiln" || c.Images["python"] != "kiln.local/python:latest" || c.CPUs != 1 || c.Policy != job.DefaultPolicy() {
		t.Fatalf("defaults: %+v", c)
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
	if v, ok := readMemoryPeak(root, "/kiln/job-1-abcd"); !ok || v != 12345678 {
		t.Fatalf("readMemoryPeak = %d, %v", v, ok)
	}
	for _, p := range []string{"", "/kiln/missing", "system.slice:kiln:job-1-abcd"} {
		if v, ok := readMemoryPeak(root, p); ok {
			t.Errorf("readMemoryPeak(%q) = %d; want not ok", p, v)
		}
	}
	// A path climbing out of the hierarchy stays inside root.
	if _, ok := readMemoryPeak(root, "/../../kiln/job-1-abcd"); !ok {
		t.Error("a cleaned path inside root should read")
	}
}

func TestCreateErrorChain(t *testing.T) {
	cause := errors.New("runc create failed")
	err := fmt.Errorf("run job: %w", createError{cause})
	if !errors.Is(err, ErrCreate) || !errors.Is(err, cause) {
		t.Fatalf("%v: want both ErrCreate and the cause in the chain", err)
	}
	var cf interface{ SandboxCreateFailed() bool }
	if !errors.As(err, &cf) || !cf.SandboxCreateFailed() {
		t.Fatalf("%v: no SandboxCreateFailed method in the chain", err)
	}
	if !strings.Contains(err.Error(), "runc create failed") {
		t.Fatalf("message %q lost the cause", err)
	}
}
