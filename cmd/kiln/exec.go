package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	goruntime "runtime"
	"runtime/debug"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

func init() {
	register("exec", "run a file straight through the sandbox (no queue)", cmdExec)
}

// Exit codes of kiln exec besides the program's own: the conventions of
// timeout(1) and of a shell reporting a signal death.
const (
	exitUsage    = 2   // bad flags or an invalid job
	exitInternal = 70  // EX_SOFTWARE: the sandbox itself failed
	exitTimeout  = 124 // the wall-clock or CPU limit ended the program, as timeout(1)
	exitOOM      = 137 // 128+SIGKILL: the memory limit ended the program
	exitCanceled = 130 // 128+SIGINT: kiln exec was interrupted
)

func cmdExec(ctx context.Context, args []string) int {
	// kiln exec is one short run that mostly waits on containerd, and every
	// CPU it takes is taken from the sandbox it started: on a 2-core host the
	// Go scheduler's idle processors spinning for work cost about 8% of a
	// print(1) run, so one processor is used (an explicit GOMAXPROCS wins).
	if os.Getenv("GOMAXPROCS") == "" {
		goruntime.GOMAXPROCS(1)
	}
	fs := flag.NewFlagSet("kiln exec", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: kiln exec [flags] FILE|-

Runs FILE (or stdin with -) in a sandbox on the local containerd
($KILN_CONTAINERD_ADDRESS, default %s) and prints the
program's stdout and stderr as it wrote them. Limits left at 0 take the
server defaults (job.DefaultLimits).

Exit status: the program's own exit code; %d when it ran out of time (wall
clock or CPU), %d when it ran out of memory, 128+N when a signal N killed it,
%d when interrupted, %d for bad flags or an invalid job, %d when the sandbox
itself failed.

flags:
`, sandbox.AddressDefault, exitTimeout, exitOOM, exitCanceled, exitUsage, exitInternal)
		fs.PrintDefaults()
	}
	runtime := fs.String("runtime", job.DefaultRuntime, "sandbox runtime")
	timeout := fs.Duration("timeout", 0, "wall-clock limit, e.g. 5s (0: default)")
	memory := fs.Int64("memory", 0, "memory+swap limit in MB (0: default)")
	cpu := fs.Duration("cpu", 0, "CPU time limit, e.g. 2s, rounded up to whole seconds (0: default)")
	pids := fs.Int64("pids", 0, "processes and threads at once (0: default)")
	output := fs.Int64("output-bytes", 0, "bytes of stdout and of stderr kept (0: default)")
	disk := fs.Int64("disk", 0, "size of /tmp and /work in MB, each (0: default)")
	stdinFile := fs.String("stdin", "", "file fed to the program's stdin")
	asJSON := fs.Bool("json", false, "print the whole result as JSON instead of the program's output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	code, err := execReadInput(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
		return exitUsage
	}
	spec := job.Spec{Runtime: *runtime, Code: string(code), Limits: job.Limits{
		TimeoutMS: timeout.Milliseconds(), MemoryMB: *memory, CPUMS: cpu.Milliseconds(),
		Pids: *pids, OutputBytes: *output, DiskMB: *disk,
	}}
	if *stdinFile != "" {
		b, err := os.ReadFile(*stdinFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kiln exec: --stdin: %v\n", err)
			return exitUsage
		}
		spec.Stdin = string(b)
	}

	// Every runtime `make image` builds; only the one asked for is resolved.
	images, _ := sandbox.ImagesFor(sandbox.RuntimesDefault())
	cfg := sandbox.Config{
		Address:   os.Getenv("KILN_CONTAINERD_ADDRESS"),
		Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"),
		Images:    images,
		WorkerID:  "kiln-exec",
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	// The same checks a producer makes, so a bad job is refused here with
	// the message an API client would get, before containerd is contacted.
	spec.Normalize()
	if err := execValidate(&spec, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
		return exitUsage
	}
	rt, err := sandbox.New(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
		return exitInternal
	}
	defer rt.Close()

	restoreGC := pauseGC()
	res, err := rt.Run(ctx, sandbox.Request{ID: job.NewID(), Spec: spec})
	restoreGC()
	var invalid *job.InvalidError
	if errors.As(err, &invalid) {
		fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
		return exitUsage
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
		}
	} else {
		execWriteOutput(os.Stdout, res.Stdout, res.StdoutBase64)
		execWriteOutput(os.Stderr, res.Stderr, res.StderrBase64)
		if res.StdoutTruncated || res.StderrTruncated {
			fmt.Fprintf(os.Stderr, "kiln exec: output truncated (stdout %d bytes, stderr %d bytes produced; %d kept of each)\n",
				res.StdoutBytes, res.StderrBytes, res.Limits.OutputBytes)
		}
		switch res.Status {
		case job.StatusSucceeded, job.StatusFailed:
			// The program's own output already says what happened.
		default:
			msg := ""
			if res.Error != nil {
				msg = ": " + res.Error.Message
			}
			fmt.Fprintf(os.Stderr, "kiln exec: %s%s\n", res.Status, msg)
		}
	}
	if err != nil && !*asJSON && res.Status != job.StatusInternalError {
		fmt.Fprintf(os.Stderr, "kiln exec: %v\n", err)
	}
	return execExitCode(res)
}

func execValidate(spec *job.Spec, cfg sandbox.Config) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	known := make([]string, 0)
	for rt := range cfg.Images {
		known = append(known, rt)
	}
	if len(known) == 0 {
		for rt := range sandbox.ImagesDefault() {
			known = append(known, rt)
		}
	}
	if err := job.ValidateRuntime(spec.Runtime, known); err != nil {
		return err
	}
	lim, err := job.DefaultPolicy().Resolve(spec.Limits)
	if err != nil {
		return err
	}
	spec.Limits = lim
	return nil
}

func execReadInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// execWriteOutput writes the exact bytes the program produced: the base64 copy
// when the text had to be made valid UTF-8.
func execWriteOutput(w io.Writer, text, b64 string) {
	if b64 != "" {
		if raw, err := base64.StdEncoding.DecodeString(b64); err == nil {
			w.Write(raw)
			return
		}
	}
	io.WriteString(w, text)
}

// execExitCode mirrors the job's outcome in kiln exec's exit status.
func execExitCode(res job.Result) int {
	switch res.Status {
	case job.StatusSucceeded, job.StatusFailed:
		if res.ExitCode != nil {
			return *res.ExitCode
		}
		if res.Signal != "" {
			if s := unix.SignalNum(res.Signal); s != 0 {
				return 128 + int(s)
			}
		}
		return 1
	case job.StatusTimedOut:
		return exitTimeout
	case job.StatusOOMKilled:
		return exitOOM
	case job.StatusCanceled:
		return exitCanceled
	default:
		return exitInternal
	}
}

// pauseGC stops garbage collection while the sandbox runs, where a collection
// competes with the sandbox for the host's cores (about 5% of a print(1) run
// on 2 cores), unless the heap nears 256 MiB (draining a huge output makes
// garbage). The returned func puts the collector back as it was, for the
// allocations of printing the result. GOGC or GOMEMLIMIT in the environment
// leave the collector alone.
func pauseGC() (restore func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	percent := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(256 << 20)
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}
