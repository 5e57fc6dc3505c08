package outcome

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// Ending is everything the outcome depends on, gathered after the task exited.
// Only the runtime's own observations decide the status: its timer, its
// cancellation, the cgroup's OOM-kill counter and kiln-init's report (which
// the job cannot forge, see initproto). Nothing the program prints does.
type Ending struct {
	// Init is kiln-init's report on the launcher; nil when there is none
	// (the runtime killed the task, or the init failed).
	Init *initproto.Status
	// InitErr says why Init is nil, for the message.
	InitErr error
	// TaskExit is the container's exit status as containerd reports it
	// (kiln-init's own); for traces only, never judged.
	TaskExit uint32
	TimedOut bool          // the wall-clock timer fired and the runtime killed the task
	Canceled bool          // the caller's context ended and the runtime killed the task
	Timeout  time.Duration // the wall-clock limit, for the message
	CPULimit time.Duration // RLIMIT_CPU's soft limit
	// CPUExceeded: the job's CPU time over all its processes passed its
	// limit and the runtime ended it (a box job; elsewhere RLIMIT_CPU
	// bounds each process).
	CPUExceeded bool
	Usage       Usage  // from the cgroup after exit
	MemoryLimit int64  // bytes
	StderrTail  []byte // the last bytes of stderr
	Runtime     string
	ImageName   string
	// Classifier reads the runtime's stderr (its profile's); zero: none. It
	// only refines the category and message of a job that already failed;
	// it never changes a status.
	Classifier Classifier
	// HasModule lists the other runtimes whose images have a module, for
	// the message of a failed import; nil: none known.
	HasModule func(module string) []string
	// InitLostWhileRunning: a box's supervisor says the job had started
	// (or its init was lost) and the worker's lease on it held, so whatever
	// ended the job's init without a report (InitErr) happened while the
	// job ran: the job is judged failed, not retried, as its likeliest
	// cause.
	InitLostWhileRunning bool
}

// Decide maps how a job ended to what a client is told. It is the only place
// that decides status, category, exit code and signal.
func Decide(e Ending) (status job.Status, failure *job.Failure, exitCode *int, signal string) {
	status, failure, exitCode, signal = decide(e)
	if e.InitErr != nil && status == job.StatusInternalError && e.InitLostWhileRunning {
		return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, e.InitErr.Error()), exitCode, signal
	}
	return status, failure, exitCode, signal
}

// decide is Decide before a lost init is laid at the job's door.
func decide(e Ending) (status job.Status, failure *job.Failure, exitCode *int, signal string) {
	if e.Canceled || e.TimedOut {
		// The runtime killed every process itself.
		signal = "SIGKILL"
		if e.Canceled {
			return job.StatusCanceled, job.NewFailure(job.CategoryCanceled, "canceled before the program finished"), nil, signal
		}
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, fmt.Sprintf("the program ran longer than the %s wall-clock limit and was killed", e.Timeout)), nil, signal
	}
	if e.CPUExceeded {
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, fmt.Sprintf("the program's processes used up its %s CPU time limit together and were killed", e.CPULimit)), nil, "SIGKILL"
	}
	in := e.Init
	if in != nil {
		if in.Signal != 0 {
			signal = signalName(in.Signal)
		} else {
			exitCode = job.IntPtr(in.ExitCode)
		}
	}
	last := LastLine(e.StderrTail)
	switch {
	case in != nil && in.TimedOut && in.Ready:
		// kiln-init's own wall-clock limit: the worker's timer did not act.
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, fmt.Sprintf("the program ran longer than the %s wall-clock limit and was killed", e.Timeout)), exitCode, signal
	case e.Usage.OOMKills > 0:
		// The kernel's own count of OOM kills in the job's cgroup.
		return job.StatusOOMKilled, job.NewFailure(job.CategoryMemoryLimit, fmt.Sprintf("the program ran out of memory (limit %d MB)", e.MemoryLimit>>20)), exitCode, signal
	case in == nil && e.Usage.MemoryLimitHits > 0:
		// No report, and the cgroup's memory reached its limit: under
		// gVisor the sandbox's kernel runs in the job's cgroup and can be
		// the one that fails to get memory. The job caused it.
		return job.StatusOOMKilled, job.NewFailure(job.CategoryMemoryLimit, fmt.Sprintf("the program ran out of memory (limit %d MB) and the sandbox ended without a report", e.MemoryLimit>>20)), nil, ""
	case in == nil && e.Usage.PidsLimitHits > 0:
		// No report, and the cgroup refused forks at its pids limit: the
		// job's processes exhausted it (under gVisor, its kernel then cannot
		// start a thread and dies). The job's failure, not the platform's.
		return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, "the program reached its limit of processes and threads and the sandbox ended without a report"), nil, ""
	case in == nil:
		return job.StatusInternalError, job.NewFailure(job.CategoryInternal, fmt.Sprintf("the sandbox's init reported no status: %v", e.InitErr)), nil, ""
	case !in.Ready:
		msg := "the sandbox launcher could not set up the job"
		if in.TimedOut {
			msg += ": it did not receive the job in time"
		}
		if bytes.HasPrefix(last, []byte("kiln-launcher:")) || len(last) > 0 {
			msg += ": " + string(last)
		}
		return job.StatusInternalError, job.NewFailure(job.CategoryInternal, msg), exitCode, signal
	case (in.Signal == int(syscall.SIGXCPU) || in.Signal == int(syscall.SIGKILL)) && cpuLimitReached(e):
		// RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
		// for a program that handles SIGXCPU. Either counts only with the
		// CPU time spent: a program that sends itself SIGXCPU (or lowers
		// its own rlimit) has failed, not timed out.
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, fmt.Sprintf("the program used up its %s CPU time limit and was killed", e.CPULimit)), exitCode, signal
	case in.Signal != 0:
		msg := "the program was killed by " + signal
		if e.Classifier.OutOfMemory != nil && e.Classifier.OutOfMemory(e.StderrTail) {
			// The interpreter's own heap limit (V8's, set from the memory
			// limit) ended it; the cgroup did not have to kill anything.
			msg = fmt.Sprintf("the program ran out of the interpreter's heap (memory limit %d MB) and was killed by %s: %s", e.MemoryLimit>>20, signal, last)
		}
		return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, msg), exitCode, signal
	case in.ExitCode == 0:
		return job.StatusSucceeded, nil, exitCode, ""
	}
	if f := classified(e); f != nil {
		return job.StatusFailed, f, exitCode, ""
	}
	msg := fmt.Sprintf("the program exited with code %d", in.ExitCode)
	if len(last) > 0 {
		msg += ": " + string(last)
	}
	return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, msg), exitCode, ""
}

// cpuLimitReached: the job's CPU time reached most of the RLIMIT_CPU soft
// limit, by the larger of kiln-init's rusage of the launcher (which includes
// the reaped children) and the cgroup's count. The kernel checks the rlimit
// at tick granularity and a busy host's accounting lags: the rusage of a
// process just sent SIGXCPU for a 1 s limit read 0.993 s on an idle 6.18
// host, and the cgroup's 0.921 s on a loaded one. A quarter of slack keeps
// real limits timed_out while a program that sends itself SIGXCPU early (a
// few milliseconds in) stays failed.
func cpuLimitReached(e Ending) bool {
	if e.CPULimit <= 0 || e.Init == nil {
		return false
	}
	spent := max(time.Duration(e.Init.CPUMicros)*time.Microsecond, e.Usage.CPU)
	return spent >= e.CPULimit-e.CPULimit/4
}

// classified is the runtime's classifier's reading of a failed program's
// stderr, nil when it has none.
func classified(e Ending) *job.Failure {
	if e.Classifier.Failure == nil {
		return nil
	}
	v, ok := e.Classifier.Failure(e.StderrTail)
	if !ok {
		return nil
	}
	if v.Module == "" {
		return job.NewFailure(v.Category, v.Message)
	}
	msg := fmt.Sprintf("module %q is not installed in the %s runtime's image (%s); only the image's packages can be imported (GET /v1/runtimes lists them)", v.Module, e.Runtime, e.ImageName)
	if e.HasModule != nil {
		if others := e.HasModule(v.Module); len(others) > 0 {
			msg += fmt.Sprintf("; runtime %s has it", strings.Join(others, ", "))
		}
	}
	return job.NewFailure(v.Category, msg+": "+v.Message)
}

func signalName(n int) string {
	if s := unix.SignalName(syscall.Signal(n)); s != "" {
		return s
	}
	return fmt.Sprintf("signal %d", n)
}

// LastLine is the last non-empty line, at most 1 KiB of it, valid UTF-8.
func LastLine(b []byte) []byte {
	b = bytes.TrimRight(b, " \t\r\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}

// Usage is what a job used, read from its cgroup after it exited and before
// the task is deleted (deleting the task removes the cgroup).
type Usage struct {
	CPU           time.Duration
	MemoryPeak    int64  // bytes; a lower bound when PeakEstimated
	PeakEstimated bool   // MemoryPeak is not the kernel's high-water mark (cgroup v2 without memory.peak in the metrics)
	MemoryFailcnt uint64 // times the memory limit was hit (cgroup v1 only)
	OOMKills      uint64 // processes the kernel OOM-killed in the cgroup
	// Read only for a sandbox that ended without its init's status: how
	// often the cgroup refused a fork at its pids limit and how often
	// memory hit its limit.
	PidsLimitHits   uint64
	MemoryLimitHits uint64
}
