package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// batchParallelism bounds the submissions of one batch processed at once.
const batchParallelism = 8

type batchRequest struct {
	Jobs []json.RawMessage `json:"jobs"`
	// CallbackURL is the callback_url of every job of the batch that names none itself.
	CallbackURL string `json:"callback_url,omitempty"`
}

// batchItem is one entry of a batch answer, in request order: the HTTP
// status the job would have got on its own and its body, or an error.
type batchItem struct {
	Index  int      `json:"index"`
	Status int      `json:"status"`
	Job    any      `json:"job,omitempty"`
	Error  *problem `json:"error,omitempty"`
}

// handleBatch answers POST /v1/jobs/batch. Each job is submitted like
// POST /v1/jobs and gets its own trace (linked to the batch's span); one
// job's failure does not affect the others.
func (jr *jobRoutes) handleBatch(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := jr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := jr.tracer.Start(ctx, "submit.batch", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	if r.Header.Get("Idempotency-Key") != "" {
		p := newProblem(http.StatusBadRequest, job.ProblemInvalidParameter, "Idempotency-Key not supported on batches",
			"Idempotency-Key applies to POST /v1/jobs only; submit jobs one by one to make them idempotent")
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
	var req batchRequest
	if p := decodeChecked(body, &req, batchSchema, ""); p != nil {
		fail(w, span, p)
		return
	}
	if len(req.Jobs) == 0 {
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemInvalidField, "Empty batch", `send {"jobs": [spec, ...]} with at least one job`)
		p.Field = "jobs"
		fail(w, span, p)
		return
	}
	if len(req.Jobs) > jr.cfg.MaxBatch {
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemBatchTooLarge, "Batch too large",
			fmt.Sprintf("the batch holds %d jobs; the maximum is %d per batch: split it", len(req.Jobs), jr.cfg.MaxBatch))
		p.Field, p.Limit = "jobs", int64(jr.cfg.MaxBatch)
		fail(w, span, p)
		return
	}
	items := make([]batchItem, len(req.Jobs))
	sem := make(chan struct{}, batchParallelism)
	var wg sync.WaitGroup
	for i, raw := range req.Jobs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			items[i] = jr.batchOne(ctx, span, i, raw, caller, req.CallbackURL)
		}()
	}
	wg.Wait()
	budget := jr.cfg.MaxListBytes
	for i := range items {
		if rv, ok := items[i].Job.(*resultView); ok {
			if p := jr.results.inlineOutput(ctx, rv, &budget); p != nil {
				items[i].Status, items[i].Job, items[i].Error = p.Status, nil, p
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": items})
}

func (jr *jobRoutes) batchOne(ctx context.Context, batch trace.Span, i int, raw json.RawMessage, caller, callbackURL string) batchItem {
	ctx, span := jr.tracer.Start(ctx, ktrace.SpanSubmit, trace.WithNewRoot(),
		trace.WithLinks(trace.Link{SpanContext: batch.SpanContext()}), trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	var spec job.Spec
	where := fmt.Sprintf("jobs[%d].", i)
	if p := decodeChecked(raw, &spec, specSchema, where); p != nil {
		return batchItem{Index: i, Status: p.Status, Error: p}
	}
	if spec.CallbackURL == "" {
		spec.CallbackURL = callbackURL
	}
	out, err := jr.submissions.submit(ctx, caller, spec, submitOptions{})
	if err != nil {
		p := jr.problems.toProblem(ctx, "submit job", err)
		if p.Field != "" && (p.Type == job.ProblemInvalidField || p.Type == job.ProblemEgressNotAllowed) {
			p.Field = where + p.Field
		}
		return batchItem{Index: i, Status: p.Status, Error: p}
	}
	return batchItem{Index: i, Status: out.httpStatus(), Job: out.body}
}
