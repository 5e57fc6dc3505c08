package sandbox

import (
	"context"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/artifacts"
	ktrace "github.com/kilnrun/kiln/trace"
)

// target is where one run of a program happens: a container of its own
// (containerTarget), or an inner sandbox of a box, for a job or a session's
// call (boxTarget). They differ in how a run reaches them and how its end
// is seen; execute delivers, watches, collects and judges every run the
// same way through them.
type target interface {
	// sandbox is the sandbox whose buffers hold the run's output.
	sandbox() *sandbox
	// listen returns the listener the run's egress proxy serves, made in
	// the run's own network namespace (a run with a network only; it may
	// block until the namespace exists).
	listen(ctx context.Context) (net.Listener, error)
	// deliver hands the run its frame and stdin: the program starts.
	deliver(ctx context.Context) error
	// watch waits for the run's end, ending it at its wall clock (e.Timeout),
	// its CPU time over all its processes or ctx's end, and returns how it
	// ended: e with its launcher's report (Init) or why there is none
	// (InitErr). An error is the platform's: nothing can be judged.
	watch(ctx context.Context, lim job.Limits, e ending) (ending, error)
	// started reports whether the run's launcher became ready (so its
	// network namespace, and an egress listener, existed).
	started() bool
	// finish collects what the ended run left and used: e.Usage, the
	// artifacts into res, and the output channel's display outputs and
	// exception; jobCPU is the run's own CPU time (the figure reported,
	// where e.Usage.CPU is the one judged).
	finish(ctx context.Context, res *job.Result, e *ending) (outs artifacts.OutputStream, jobCPU time.Duration)
}

// executor is the one path every run takes (execute), with what it arms
// on a sandbox before (arm.go) and the facts its judgement needs
// (endingFor, outcome.go): a job's run in a container of its own or in a
// box, and a session's call.
type executor struct {
	cfg       Config
	tracer    trace.Tracer
	log       *slog.Logger
	swapLimit bool
	images    *imageCache // the other runtimes' modules (hasModule)
	// judged, when set (tests), is called with the id of every run judged.
	judged func(id string)
}

// execute runs one program on t: it serves the run's egress, delivers it,
// watches it to its end (span sandbox.wait), then collects what it left and
// judges it (span sandbox.collect). Every run of every kind is judged here,
// once. An error is a platform fault before the run could be judged: res
// holds what was known, and the caller decides what the fault means for its
// kind of run.
func (x *executor) execute(ctx context.Context, t target, req Request, lim job.Limits, res job.Result, e ending) (job.Result, error) {
	sb := t.sandbox()
	attrs := trace.WithAttributes(ktrace.ContainerIDKey.String(sb.id), ktrace.JobIDKey.String(req.ID))
	var egress *egressRun
	if !req.Spec.Network.Empty() {
		egress = serveEgress(ctx, req.Net(), t.listen)
		defer egress.finish()
	}
	wctx, wspan := x.tracer.Start(ctx, ktrace.SpanSandboxWait, attrs)
	started := time.Now()
	err := t.deliver(wctx)
	if err == nil {
		e, err = t.watch(wctx, lim, e)
	}
	res.WallMS = time.Since(started).Milliseconds()
	if egress != nil {
		var eerr error
		if res.Egress, eerr = egress.finish(); eerr != nil && t.started() {
			x.log.WarnContext(ctx, "the run's egress proxy did not start", slog.String("container_id", sb.id), slog.Any("error", eerr))
		}
	}
	if err != nil {
		endSpan(wspan, err)
		return res, err
	}
	wspan.SetAttributes(ktrace.ExitCodeKey.Int(int(e.TaskExit)), attribute.Bool("kiln.timed_out", e.TimedOut))
	wspan.End()

	cctx, cspan := x.tracer.Start(ctx, ktrace.SpanSandboxCollect, attrs)
	defer cspan.End()
	outs, jobCPU := t.finish(cctx, &res, &e)
	artifacts.PlaceOutputs(cctx, req.Store, &res, outs)
	result := judge(cspan, sb, res, e, jobCPU)
	artifacts.AttachException(&result, outs)
	if x.judged != nil {
		x.judged(req.ID)
	}
	return result, nil
}
