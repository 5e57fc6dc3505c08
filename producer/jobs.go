package producer

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// jobRoutes answer the routes of jobs: submission (submit.go), batches
// (batch.go), reads and long-polls, lists (list.go, joblisting.go),
// cancellation, replay (replay.go) and artifacts (artifacts.go).
type jobRoutes struct {
	cfg         *Config
	store       Store
	nc          *nats.Conn  // cancellations reach the job's worker
	blobs       *blob.Store // artifacts, replayed specs sent by reference
	bodies      *bodyBudget
	submissions *submissions
	runtimes    *registry
	budgets     *budgets
	audit       *auditLog
	waits       *waits
	results     *resultWriter
	problems    *problems
	tracer      trace.Tracer
	prop        propagation.TextMapPropagator
	metrics     *ktrace.Metrics
	log         *slog.Logger
}

// listItem is one entry of GET /v1/jobs?ids=: the job, or an error.
type listItem struct {
	ID    string   `json:"id"`
	Error *problem `json:"error"`
}

// distinct returns ids without repeats, in first-seen order.
func distinct(ids []string) []string {
	seen := make(map[string]struct{}, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}

// handleGet answers GET /v1/jobs/{id}, long-polling with ?wait=.
func (jr *jobRoutes) handleGet(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	wait, p := jr.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	rec, err := jr.waits.await(ctx, caller, id, wait)
	if errors.Is(err, cache.ErrNotFound) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "get job", err))
		return
	}
	body, _ := recordView(&rec)
	jr.results.writeBody(ctx, w, http.StatusOK, body)
}

// handleList answers GET /v1/jobs?ids=a,b,c in the order asked, each
// distinct id once (repeats are dropped, so a repeated id costs nothing),
// at most MaxBatch ids. Jobs of other tenants are answered as not found.
// Without ids it lists the caller's jobs (joblisting.go).
func (jr *jobRoutes) handleList(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	q := r.URL.Query()
	if !q.Has("ids") {
		jr.handleJobListing(w, r, caller)
		return
	}
	raw := q.Get("ids")
	if len(q) > 1 {
		for name := range q {
			if name != "ids" {
				writeProblem(w, badParam(name, "ids= reads the jobs named; it takes no filter or page ("+name+"): list jobs without ids="))
				return
			}
		}
	}
	if strings.TrimSpace(raw) == "" {
		writeProblem(w, badParam("ids", "send the job ids to read as ?ids=ID1,ID2 (at most "+fmt.Sprint(jr.cfg.MaxBatch)+")"))
		return
	}
	ids := strings.Split(raw, ",")
	if len(ids) > jr.cfg.MaxBatch {
		p := newProblem(http.StatusBadRequest, job.ProblemBatchTooLarge, "Too many ids",
			fmt.Sprintf("%d ids asked; the maximum is %d per request: split the list", len(ids), jr.cfg.MaxBatch))
		p.Field, p.Limit = "ids", int64(jr.cfg.MaxBatch)
		writeProblem(w, p)
		return
	}
	for i, id := range ids {
		ids[i] = strings.TrimSpace(id)
		if !job.ValidID(ids[i]) {
			p := invalidID(ids[i])
			p.Field = fmt.Sprintf("ids[%d]", i)
			writeProblem(w, p)
			return
		}
	}
	ids = distinct(ids)
	out, err := jr.listViews(ctx, caller, ids)
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "get jobs", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out})
}

// handleCancel answers DELETE /v1/jobs/{id}: a queued job is canceled at
// once (and its long-pollers woken); a running one is asked to stop through
// kiln.cancel, answered 202; a terminal one is left as it is.
func (jr *jobRoutes) handleCancel(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	if _, err := tenantJob(ctx, jr.store, caller, id); err != nil {
		if errors.Is(err, cache.ErrNotFound) {
			writeProblem(w, notFound(id))
		} else {
			writeProblem(w, jr.problems.storeProblem(ctx, "cancel job", err))
		}
		return
	}
	st, canceledNow, err := jr.store.CancelReport(ctx, id)
	if errors.Is(err, cache.ErrNotFound) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "cancel job", err))
		return
	}
	// Logged before a worker hears of it, so the log has the cancel before
	// the result it causes.
	jr.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditCancel, JobID: id, Status: st})
	switch st {
	case job.StatusRunning:
		if err := jr.nc.Publish(job.CancelSubject, []byte(id)); err != nil {
			// The flag is in the record: a redelivery will not run the job.
			jr.log.WarnContext(ctx, "publish cancel request", slog.String("job_id", id), slog.Any("error", err))
		}
	case job.StatusCanceled:
		notice, _ := json.Marshal(job.DoneNotice{ID: id, Status: st})
		if err := jr.nc.Publish(job.DoneSubject(id), notice); err != nil {
			jr.log.WarnContext(ctx, "publish completion notice of canceled job", slog.String("job_id", id), slog.Any("error", err))
		}
	}
	jr.log.InfoContext(ctx, "cancel requested", slog.String("job_id", id), slog.String("status", string(st)), slog.String("caller", caller))
	rec, err := tenantJob(ctx, jr.store, caller, id)
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "get job", err))
		return
	}
	if canceledNow {
		// Canceled while queued: no worker will count it, so the API does.
		jr.metrics.JobFinished(ctx, rec.Message.Spec.Runtime, string(job.StatusCanceled), 0, time.Since(rec.Message.CreatedAt))
		jr.budgets.releaseBudget(ctx, rec.Message)
	}
	body, terminal := recordView(&rec)
	status := http.StatusOK
	if !terminal {
		status = http.StatusAccepted
	}
	jr.results.writeBody(ctx, w, status, body)
}
