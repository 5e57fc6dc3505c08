package sandbox

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
)

// launchErrorCode is the exit code launch.py uses when the job frame or the
// input files could not be set up; it prints a "kiln-launcher:" line then.
const launchErrorCode = 125

// ending is everything the outcome depends on, gathered after the task exited.
type ending struct {
	ExitCode    uint32        // as containerd reports it: 128+n when killed by signal n
	TimedOut    bool          // the wall-clock timer fired and the runtime killed the task
	Canceled    bool          // the caller's context ended and the runtime killed the task
	Timeout     time.Duration // the wall-clock limit, for the message
	Usage       usage         // from the cgroup after exit
	MemoryLimit int64         // bytes
	StderrTail  []byte        // the last bytes of stderr
	Runtime     string
	ImageName   string
	// Classifier reads the runtime's stderr (its profile's); zero: none.
	Classifier classifier
	// HasModule lists the other runtimes whose images have a module, for
	// the message of a failed import; nil: none known.
	HasModule func(module string) []string
}

// outcome maps how a job ended to what a client is told. It is the only place
// that decides status, category, exit code and signal.
func outcome(e ending) (status job.Status, failure *job.Failure, exitCode *int, signal string) {
	sig := signalOf(e.ExitCode)
	if sig != 0 {
		signal = unix.SignalName(sig)
		if signal == "" {
			signal = fmt.Sprintf("signal %d", int(sig))
		}
	} else {
		exitCode = job.IntPtr(int(e.ExitCode))
	}
	last := lastLine(e.StderrTail)
	switch {
	case e.Canceled:
		return job.StatusCanceled, job.NewFailure(job.CategoryCanceled, "canceled before the program finished"), exitCode, signal
	case e.TimedOut:
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, fmt.Sprintf("the program ran longer than the %s wall-clock limit and was killed", e.Timeout)), exitCode, signal
	case e.ExitCode == 0:
		return job.StatusSucceeded, nil, exitCode, ""
	case e.Usage.OOMKills > 0,
		sig == syscall.SIGKILL && e.MemoryLimit > 0 && (e.Usage.MemoryFailcnt > 0 || e.Usage.MemoryPeak >= e.MemoryLimit),
		e.Classifier.outOfMemory != nil && e.Classifier.outOfMemory(e.StderrTail):
		// The interpreter's own report (MemoryError, V8's heap limit) is the
		// same event seen from inside: an allocation the limit refused
		// before the kernel had to kill.
		return job.StatusOOMKilled, job.NewFailure(job.CategoryMemoryLimit, fmt.Sprintf("the program ran out of memory (limit %d MB)", e.MemoryLimit>>20)), exitCode, signal
	case sig == syscall.SIGXCPU:
		return job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, "the program used up its CPU time limit and was killed"), exitCode, signal
	case sig != 0:
		return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, "the program was killed by "+signal), exitCode, signal
	case e.ExitCode == launchErrorCode && bytes.HasPrefix(last, []byte("kiln-launcher:")):
		return job.StatusInternalError, job.NewFailure(job.CategoryInternal, "the sandbox launcher could not set up the job: "+string(last)), exitCode, ""
	}
	if f := classified(e); f != nil {
		return job.StatusFailed, f, exitCode, ""
	}
	msg := fmt.Sprintf("the program exited with code %d", e.ExitCode)
	if len(last) > 0 {
		msg += ": " + string(last)
	}
	return job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, msg), exitCode, ""
}

// classified is the runtime's classifier's reading of a failed program's
// stderr, nil when it has none.
func classified(e ending) *job.Failure {
	if e.Classifier.failure == nil {
		return nil
	}
	v, ok := e.Classifier.failure(e.StderrTail)
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

// signalOf reads containerd's exit status: the shim reports 128+n for a
// process killed by signal n. A program calling exit(137) is indistinguishable
// from a SIGKILL; that ambiguity is the shell's too.
func signalOf(code uint32) syscall.Signal {
	if code > 128 && code < 128+65 {
		return syscall.Signal(code - 128)
	}
	return 0
}

// lastLine is the last non-empty line, at most 1 KiB of it, valid UTF-8.
func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, " \t\r\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}
