package sandbox

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/outcome"
	"github.com/kilnrun/kiln/sandbox/runtimes"
	ktrace "github.com/kilnrun/kiln/trace"
)

// ending is how a job ended and what it used (package outcome judges it).
type ending = outcome.Ending

// endingFor is what the outcome of a job of runtime on img with lim needs
// besides how it ended.
func (x *executor) endingFor(ctx context.Context, runtime string, img *imageEntry, lim job.Limits) ending {
	return ending{Timeout: lim.Timeout(), MemoryLimit: lim.MemoryMB << 20, Runtime: runtime, ImageName: img.ref,
		Classifier: classifierOf(img.profile), HasModule: x.hasModule(ctx, runtime)}
}

// classifierOf is the classifier p names (its name was checked when the
// profile was read).
func classifierOf(p runtimes.Profile) outcome.Classifier {
	c, _ := outcome.ClassifierFor(p.Classifier)
	return c
}

// judge builds the result of a job whose sandbox figures are in e.
func judge(span trace.Span, sb *sandbox, res job.Result, e ending, jobCPU time.Duration) job.Result {
	stdout, outTotal, outTrunc := sb.stdout.Bytes()
	stderr, errTotal, errTrunc := sb.stderr.Bytes()
	e.StderrTail = sb.stderr.Tail()

	res.Status, res.Error, res.ExitCode, res.Signal = outcome.Decide(e)
	res.SetOutput(stdout, stderr)
	res.StdoutBytes, res.StdoutTruncated = outTotal, outTrunc
	res.StderrBytes, res.StderrTruncated = errTotal, errTrunc
	res.CPUMS = jobCPU.Milliseconds()
	res.MemoryPeakBytes = e.Usage.MemoryPeak
	span.SetAttributes(
		ktrace.ExitCodeKey.Int(int(e.TaskExit)),
		ktrace.CPUTimeMSKey.Int64(res.CPUMS),
		ktrace.MemoryPeakKey.Int64(res.MemoryPeakBytes),
		ktrace.OutputBytesKey.Int64(outTotal+errTotal),
		ktrace.StatusKey.String(string(res.Status)),
	)
	return res
}
