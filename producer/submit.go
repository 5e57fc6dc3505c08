package producer

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

// httpStatus is the status an answer is given with: 200 for a result,
// 202 for a job still to end.
func (o answer) httpStatus() int {
	if o.done {
		return http.StatusOK
	}
	return http.StatusAccepted
}

// fail answers p and marks the span as failed for server-side problems.
func fail(w http.ResponseWriter, span trace.Span, p *problem) {
	if p.Status >= 500 {
		span.SetStatus(codes.Error, p.Detail)
	}
	span.SetAttributes(attribute.Int("http.response.status_code", p.Status))
	writeProblem(w, p)
}

func (jr *jobRoutes) handleSubmit(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := jr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := jr.tracer.Start(ctx, ktrace.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	wait, p := jr.waits.parseWait(r)
	if p != nil {
		fail(w, span, p)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > maxIdempotencyKey {
		p := newProblem(http.StatusBadRequest, job.ProblemInvalidParameter, "Idempotency-Key too long",
			fmt.Sprintf("the Idempotency-Key header is %d bytes; the maximum is %d (a UUID is a good key)", len(idem), maxIdempotencyKey))
		p.Field = "Idempotency-Key"
		fail(w, span, p)
		return
	}
	release, p := jr.bodies.reserve(ctx, r)
	if p != nil {
		fail(w, span, p)
		return
	}
	defer release()
	body, p := readBody(w, r, jr.cfg.MaxBodyBytes)
	if p != nil {
		fail(w, span, p)
		return
	}
	var spec job.Spec
	if p := decodeChecked(body, &spec, specSchema, ""); p != nil {
		fail(w, span, p)
		return
	}
	opts := submitOptions{idemKey: idem}
	if idem != "" {
		opts.bodyHash = bodyHash(body)
	}
	if wait > 0 {
		opts.waiter = &doneWaiter{}
		defer opts.waiter.close()
	}
	out, err := jr.submissions.submit(ctx, caller, spec, opts)
	if err != nil {
		fail(w, span, jr.problems.toProblem(ctx, "submit job", err))
		return
	}
	if wait > 0 && !out.done {
		rec, err := jr.waits.awaitSubmitted(ctx, opts.waiter, caller, out.id, wait)
		if err == nil {
			out.body, out.done = recordView(&rec)
		} else if !errors.Is(err, cache.ErrNotFound) {
			// The job was accepted: answer that, not the wait's failure.
			jr.log.WarnContext(ctx, "wait after submit", slog.String("job_id", out.id), slog.Any("error", err))
		}
	}
	if !out.done {
		w.Header().Set("Location", "/v1/jobs/"+out.id)
	}
	jr.results.writeBody(ctx, w, out.httpStatus(), out.body)
}
