package outcome

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

func TestOutcome(t *testing.T) {
	t.Parallel()
	const limit = 64 << 20
	exited := func(code int) *initproto.Status { return &initproto.Status{Ready: true, ExitCode: code} }
	killed := func(sig syscall.Signal) *initproto.Status { return &initproto.Status{Ready: true, Signal: int(sig)} }
	tests := []struct {
		name     string
		e        Ending
		status   job.Status
		category job.Category // "" for success
		signal   string
		exit     int // -1: none
		msg      string
	}{
		{"success", Ending{Init: exited(0)}, job.StatusSucceeded, "", "", 0, ""},
		{"exit code", Ending{Init: exited(3), StderrTail: []byte("boom\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 3, "code 3: boom"},
		{"exit code is never a signal", Ending{Init: exited(152)}, job.StatusFailed, job.CategoryRuntimeError, "", 152, "code 152"},
		{"exit 137 is an exit code", Ending{Init: exited(137), MemoryLimit: limit, Usage: Usage{MemoryPeak: limit}}, job.StatusFailed, job.CategoryRuntimeError, "", 137, ""},
		{"exception", Ending{Init: exited(1), StderrTail: []byte("Traceback (most recent call last):\n  File \"/work/main.py\", line 1\nZeroDivisionError: division by zero\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "ZeroDivisionError"},
		{"syntax", Ending{Init: exited(1), StderrTail: []byte("  File \"/work/main.py\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, "never closed"},
		{"indentation", Ending{Init: exited(1), StderrTail: []byte("IndentationError: unexpected indent\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, ""},
		{"tab", Ending{Init: exited(1), StderrTail: []byte("TabError: inconsistent use of tabs\n")}, job.StatusFailed, job.CategorySyntaxError, "", 1, ""},
		{"syntax mentioned mid-traceback is not a syntax error", Ending{Init: exited(1), StderrTail: []byte("SyntaxError: x\nValueError: y\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "ValueError"},
		{"missing module", Ending{Init: exited(1), Runtime: "python", ImageName: "kiln.local/python:latest", StderrTail: []byte("ModuleNotFoundError: No module named 'torch.nn'\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, `module "torch" is not installed in the python runtime's image`},
		{"timeout", Ending{TimedOut: true, Timeout: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "1s"},
		{"timeout wins over oom figures", Ending{TimedOut: true, MemoryLimit: limit, Usage: Usage{OOMKills: 1}}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, ""},
		{"init's own timeout", Ending{Init: &initproto.Status{Ready: true, TimedOut: true, Signal: 9}, Timeout: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "1s"},
		{"canceled", Ending{Canceled: true}, job.StatusCanceled, job.CategoryCanceled, "SIGKILL", -1, ""},
		{"oom counter", Ending{Init: killed(syscall.SIGKILL), MemoryLimit: limit, Usage: Usage{OOMKills: 1}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "SIGKILL", -1, "64 MB"},
		{"oom counter with a child killed", Ending{Init: exited(1), MemoryLimit: limit, Usage: Usage{OOMKills: 2}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", 1, ""},
		{"oom kill of the init itself", Ending{InitErr: errors.New("no status was written"), MemoryLimit: limit, Usage: Usage{OOMKills: 1}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", -1, ""},
		{"no status after the memory limit was hit", Ending{InitErr: errors.New("no status was written"), MemoryLimit: limit, Usage: Usage{MemoryLimitHits: 3}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", -1, "64 MB"},
		{"no status after forks were refused at the pids limit", Ending{InitErr: errors.New("no status was written"), Usage: Usage{PidsLimitHits: 40}}, job.StatusFailed, job.CategoryRuntimeError, "", -1, "limit of processes"},
		{"no status and no limit hit is the platform's", Ending{InitErr: errors.New("no status was written")}, job.StatusInternalError, job.CategoryInternal, "", -1, "no status"},
		{"limit counters do not judge a reported ending", Ending{Init: exited(0), Usage: Usage{PidsLimitHits: 40, MemoryLimitHits: 3}}, job.StatusSucceeded, "", "", 0, ""},
		{"self sigkill at the memory limit is not oom", Ending{Init: killed(syscall.SIGKILL), MemoryLimit: limit, Usage: Usage{MemoryFailcnt: 5, MemoryPeak: limit}}, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1, "SIGKILL"},
		{"a MemoryError line is not oom", Ending{Init: exited(1), MemoryLimit: limit, StderrTail: []byte("Traceback...\nMemoryError\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 1, "MemoryError"},
		{"segfault", Ending{Init: killed(syscall.SIGSEGV)}, job.StatusFailed, job.CategoryRuntimeError, "SIGSEGV", -1, "SIGSEGV"},
		{"abort", Ending{Init: killed(syscall.SIGABRT)}, job.StatusFailed, job.CategoryRuntimeError, "SIGABRT", -1, "SIGABRT"},
		{"cpu limit soft", Ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 1_000_000}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGXCPU", -1, "CPU"},
		{"cpu limit seen by the cgroup on a lagging host", Ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 700_000}, Usage: Usage{CPU: 921 * time.Millisecond}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGXCPU", -1, "CPU"},
		{"self-sent SIGXCPU is not the cpu limit", Ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGXCPU), CPUMicros: 30_000}, CPULimit: time.Second}, job.StatusFailed, job.CategoryRuntimeError, "SIGXCPU", -1, "SIGXCPU"},
		{"SIGXCPU without a cpu limit", Ending{Init: killed(syscall.SIGXCPU)}, job.StatusFailed, job.CategoryRuntimeError, "SIGXCPU", -1, "SIGXCPU"},
		{"cpu limit hard", Ending{Init: &initproto.Status{Ready: true, Signal: 9, CPUMicros: 2_000_000}, CPULimit: time.Second}, job.StatusTimedOut, job.CategoryTimeout, "SIGKILL", -1, "CPU"},
		{"sigkill below the cpu limit", Ending{Init: &initproto.Status{Ready: true, Signal: 9, CPUMicros: 100_000}, CPULimit: time.Second}, job.StatusFailed, job.CategoryRuntimeError, "SIGKILL", -1, "SIGKILL"},
		{"launcher fault before readiness", Ending{Init: &initproto.Status{ExitCode: 125}, StderrTail: []byte("kiln-launcher: stdin closed before a job header arrived\n")}, job.StatusInternalError, job.CategoryInternal, "", 125, "launcher"},
		{"launcher-looking line from the program", Ending{Init: exited(125), StderrTail: []byte("kiln-launcher: job frame is not valid\n")}, job.StatusFailed, job.CategoryRuntimeError, "", 125, "code 125"},
		{"no init status", Ending{InitErr: initproto.ErrForged}, job.StatusInternalError, job.CategoryInternal, "", -1, "nonce"},
		{"a box job's init lost while it ran is the job's", Ending{InitErr: errors.New("the job's init ended without reporting the job (killed)"), InitLostWhileRunning: true}, job.StatusFailed, job.CategoryRuntimeError, "", -1, "without reporting"},
		{"a lost init with the memory limit hit stays oom", Ending{InitErr: errors.New("lost"), InitLostWhileRunning: true, MemoryLimit: limit, Usage: Usage{OOMKills: 1}}, job.StatusOOMKilled, job.CategoryMemoryLimit, "", -1, "64 MB"},
		{"a lost init before the job ran is the platform's", Ending{InitErr: errors.New("the worker's lease on the job lapsed and the box ended it")}, job.StatusInternalError, job.CategoryInternal, "", -1, "lease"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.e.Classifier = classifiers["python"] // these endings are CPython's
			status, f, code, sig := Decide(tt.e)
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
