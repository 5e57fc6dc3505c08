package producer

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// handleGet answers GET /v1/jobs/{id}, long-polling with ?wait=.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	wait, p := s.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	rec, err := s.waits.await(ctx, caller, id, wait)
	if errors.Is(err, cache.ErrNotFound) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "get job", err))
		return
	}
	body, _ := recordView(&rec)
	s.results.writeBody(ctx, w, http.StatusOK, body)
}

// listItem is one entry of GET /v1/jobs?ids=: the job, or an error.
type listItem struct {
	ID    string   `json:"id"`
	Error *problem `json:"error"`
}

// handleList answers GET /v1/jobs?ids=a,b,c in the order asked, each
// distinct id once (repeats are dropped, so a repeated id costs nothing),
// at most MaxBatch ids. Jobs of other tenants are answered as not found.
// Without ids it lists the caller's jobs (joblisting.go).
func (s *Server) handleList(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	q := r.URL.Query()
	if !q.Has("ids") {
		s.handleJobListing(w, r, caller)
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
		writeProblem(w, badParam("ids", "send the job ids to read as ?ids=ID1,ID2 (at most "+fmt.Sprint(s.cfg.MaxBatch)+")"))
		return
	}
	ids := strings.Split(raw, ",")
	if len(ids) > s.cfg.MaxBatch {
		p := newProblem(http.StatusBadRequest, job.ProblemBatchTooLarge, "Too many ids",
			fmt.Sprintf("%d ids asked; the maximum is %d per request: split the list", len(ids), s.cfg.MaxBatch))
		p.Field, p.Limit = "ids", int64(s.cfg.MaxBatch)
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
	out, err := s.listViews(ctx, caller, ids)
	if err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "get jobs", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out})
}

// handleCancel answers DELETE /v1/jobs/{id}: a queued job is canceled at
// once (and its long-pollers woken); a running one is asked to stop through
// kiln.cancel, answered 202; a terminal one is left as it is.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	if _, err := tenantJob(ctx, s.store, caller, id); err != nil {
		if errors.Is(err, cache.ErrNotFound) {
			writeProblem(w, notFound(id))
		} else {
			writeProblem(w, s.problems.storeProblem(ctx, "cancel job", err))
		}
		return
	}
	st, canceledNow, err := s.store.CancelReport(ctx, id)
	if errors.Is(err, cache.ErrNotFound) {
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "cancel job", err))
		return
	}
	// Logged before a worker hears of it, so the log has the cancel before
	// the result it causes.
	s.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditCancel, JobID: id, Status: st})
	switch st {
	case job.StatusRunning:
		if err := s.nc.Publish(job.CancelSubject, []byte(id)); err != nil {
			// The flag is in the record: a redelivery will not run the job.
			s.log.WarnContext(ctx, "publish cancel request", slog.String("job_id", id), slog.Any("error", err))
		}
	case job.StatusCanceled:
		notice, _ := json.Marshal(job.DoneNotice{ID: id, Status: st})
		if err := s.nc.Publish(job.DoneSubject(id), notice); err != nil {
			s.log.WarnContext(ctx, "publish completion notice of canceled job", slog.String("job_id", id), slog.Any("error", err))
		}
	}
	s.log.InfoContext(ctx, "cancel requested", slog.String("job_id", id), slog.String("status", string(st)), slog.String("caller", caller))
	rec, err := tenantJob(ctx, s.store, caller, id)
	if err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "get job", err))
		return
	}
	if canceledNow {
		// Canceled while queued: no worker will count it, so the API does.
		s.metrics.JobFinished(ctx, rec.Message.Spec.Runtime, string(job.StatusCanceled), 0, time.Since(rec.Message.CreatedAt))
		s.budgets.releaseBudget(ctx, rec.Message)
	}
	body, terminal := recordView(&rec)
	status := http.StatusOK
	if !terminal {
		status = http.StatusAccepted
	}
	s.results.writeBody(ctx, w, status, body)
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
