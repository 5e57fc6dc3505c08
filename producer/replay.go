package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

func replayUnavailable(detail string) *problem {
	return newProblem(http.StatusConflict, job.ProblemReplayUnavailable, "Replay unavailable", detail)
}

// handleReplay runs a finished job again: POST /v1/jobs/{id}/replay. The
// new job has the same code, inputs and limits, runs on the same image
// digest (else 409 saying so), is never answered from the result cache,
// and its result says replay_of and whether its outcome is identical. A job
// of another tenant is 404.
func (jr *jobRoutes) handleReplay(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := jr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := jr.tracer.Start(ctx, ktrace.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		fail(w, span, invalidID(id))
		return
	}
	span.SetAttributes(attribute.String("kiln.replay_of", id))
	rec, err := tenantJob(ctx, jr.store, caller, id)
	if errors.Is(err, cache.ErrNotFound) {
		fail(w, span, notFound(id))
		return
	}
	if err != nil {
		fail(w, span, jr.problems.storeProblem(ctx, "replay job", err))
		return
	}
	spec, p := jr.replaySpec(ctx, &rec)
	if p != nil {
		fail(w, span, p)
		return
	}
	out, err := jr.submissions.submit(ctx, caller, spec, submitOptions{replayOf: id})
	if err != nil {
		fail(w, span, jr.problems.toProblem(ctx, "replay job", err))
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+out.id)
	jr.results.writeBody(ctx, w, out.httpStatus(), out.body)
}

// replaySpec is the spec that replays rec, or why there is none.
func (jr *jobRoutes) replaySpec(ctx context.Context, rec *cache.Record) (job.Spec, *problem) {
	m := rec.Message
	if !rec.Status.Terminal() || rec.Result == nil {
		return job.Spec{}, replayUnavailable(fmt.Sprintf("job %s has not finished (status %s): replay it once it has", m.ID, rec.Status))
	}
	digest := rec.Result.Image.Digest
	if digest == "" {
		return job.Spec{}, replayUnavailable(fmt.Sprintf("job %s never ran in a sandbox (status %s), so there is no image digest to replay it on", m.ID, rec.Status))
	}
	spec := m.Spec
	if m.SpecRef != nil {
		b, err := jr.blobs.GetBytes(ctx, *m.SpecRef, job.MaxSpecJSONSize)
		if err != nil {
			return job.Spec{}, replayUnavailable(fmt.Sprintf("the inputs of job %s are no longer kept (%v)", m.ID, err))
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			return job.Spec{}, jr.problems.storeProblem(ctx, "decode spec to replay", err)
		}
		spec.Limits = m.Spec.Limits
	}
	rt, err := jr.runtimes.lookup(ctx, spec.Runtime)
	if err != nil {
		return job.Spec{}, jr.problems.toProblem(ctx, "replay job", err)
	}
	if rt.Digest != digest {
		return job.Spec{}, replayUnavailable(fmt.Sprintf("job %s ran on %s image %s; the workers now serve %s, and a replay must run on the same digest: the old image is no longer available",
			m.ID, spec.Runtime, digest, rt.Digest))
	}
	// It must run, and only once: no cache, no callback, no budget charge
	// on the original's account.
	spec.Cache, spec.CallbackURL, spec.Budget = job.CacheOff(), "", ""
	return spec, nil
}
