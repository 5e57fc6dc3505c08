package producer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Pause and resume: a paused session holds no sandbox (its worker
// checkpoints /work and removes the box) and does not count among its
// tenant's live sessions; a call, or POST .../resume, brings it back on any
// worker with room, with its files (and, with restore "replay", its
// successful calls run again), and the session says what came back
// (restored).

// resumeSession brings caller's paused session id back on a worker; a
// session that is not paused is answered as it is.
func (ss *sessions) resumeSession(ctx context.Context, caller, id string) (job.Session, *problem) {
	st, p := ss.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = ss.sessionOf(ctx, st, caller, id)
	}
	if p == nil && rec.Status == job.SessionEnded {
		p = sessionEnded(rec.ID, rec.EndedReason)
	}
	if p == nil {
		rec, p = ss.ensureHeld(ctx, st, rec)
	}
	if p == nil {
		rec, p = ss.sessionOf(ctx, st, caller, rec.ID)
	}
	if p != nil {
		return job.Session{}, p
	}
	return rec.View(ss.cfg.Now()), nil
}

// handleSessionPause pauses the caller's session once the calls accepted
// before it have ended: 200 with the session once paused, or 202 with it
// when ?wait passes first (it pauses when they end).
func (sr sessionRoutes) handleSessionPause(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	wait, p := sr.ss.waits.parseWait(r)
	st, p2 := sr.ss.sessionStore()
	var rec cache.SessionRecord
	if p = cmpProblem(p, p2); p == nil {
		rec, p = sr.ss.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if r.URL.Query().Get("wait") == "" {
		wait = sr.ss.cfg.MaxWait
	}
	rec, paused, p := sr.ss.pauseSession(ctx, st, rec, wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	v := rec.View(sr.ss.cfg.Now())
	v.Links = sessionLinks(rec.ID)
	if paused {
		writeJSON(w, http.StatusOK, v)
		return
	}
	w.Header().Set("Location", v.Links["self"])
	writeJSON(w, http.StatusAccepted, v)
}

// pauseSession asks rec's holder to pause it and waits (at most wait) until
// it has. A session whose holder is gone is paused here, fenced by the
// holder the record names: its last checkpoint is what it keeps.
func (ss *sessions) pauseSession(ctx context.Context, st SessionStore, rec cache.SessionRecord, wait time.Duration) (cache.SessionRecord, bool, *problem) {
	done := make(chan *nats.Msg, 8)
	sub, err := ss.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
	if err != nil {
		return rec, false, ss.problems.storeProblem(ctx, "pause session", err)
	}
	defer sub.Unsubscribe()
	already, err := st.RequestPause(ctx, rec.Tenant, rec.ID)
	if p := ss.sessionStateProblem(ctx, "pause session", rec.ID, err); p != nil {
		return rec, false, p
	}
	if !already {
		held, err := ss.holds(ctx, st, rec)
		switch {
		case err != nil:
			return rec, false, ss.problems.storeProblem(ctx, "pause session", err)
		case held:
			_ = ss.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
		default:
			h := cache.SessionHolder{Worker: rec.Worker, Instance: rec.Instance, Inc: rec.Inc}
			if err := st.PauseHeld(ctx, rec.Tenant, rec.ID, h, ss.cfg.Now()); err != nil && !errors.Is(err, cache.ErrSessionFenced) {
				return rec, false, ss.sessionStateProblem(ctx, "pause session", rec.ID, err)
			}
		}
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		rec, err = st.Session(ctx, rec.ID)
		if err != nil {
			return rec, false, ss.problems.storeProblem(ctx, "pause session", err)
		}
		if rec.Status == job.SessionPaused || rec.Status == job.SessionEnded {
			if rec.Status == job.SessionPaused {
				ss.audit.appendAudit(ctx, rec.Tenant, job.AuditRecord{Kind: job.AuditSessionPaused, SessionID: rec.ID})
			}
			return rec, rec.Status == job.SessionPaused, nil
		}
		select {
		case <-done:
		case <-deadline.C:
			return rec, false, nil
		case <-ctx.Done():
			return rec, false, nil
		case <-ss.waits.done.Done():
			return rec, false, nil
		}
	}
}

// handleSessionResume brings the caller's paused session back on a worker
// and answers it with what came back (restored); a session that is not
// paused is answered as it is.
func (sr sessionRoutes) handleSessionResume(w http.ResponseWriter, r *http.Request, caller string) {
	v, p := sr.ss.resumeSession(r.Context(), caller, r.PathValue("id"))
	if p != nil {
		writeProblem(w, p)
		return
	}
	v.Links = sessionLinks(v.ID)
	writeJSON(w, http.StatusOK, v)
}

// resumeIfPaused makes rec, when paused, one of its tenant's live sessions
// again so that a worker may claim it; at the tenant's bound of live
// sessions it answers 429.
func (ss *sessions) resumeIfPaused(ctx context.Context, st SessionStore, rec cache.SessionRecord) *problem {
	if rec.Status != job.SessionPaused {
		return nil
	}
	resumed, err := st.Resume(ctx, rec.Tenant, rec.ID, ss.cfg.SessionsPerTenant, ss.cfg.Now())
	if resumed {
		ss.audit.appendAudit(ctx, rec.Tenant, job.AuditRecord{Kind: job.AuditSessionResumed, SessionID: rec.ID})
	}
	if errors.Is(err, cache.ErrSessionQuota) {
		p := newProblem(http.StatusTooManyRequests, job.ProblemQuotaPrefix+"sessions", "Too many sessions",
			fmt.Sprintf("session %s is paused, and this API key has %d live sessions, the most it may hold: pause or delete one (POST /v1/sessions/{id}/pause, DELETE /v1/sessions/{id}) before resuming this one",
				rec.ID, ss.cfg.SessionsPerTenant))
		p.Limit = int64(ss.cfg.SessionsPerTenant)
		return p
	}
	return ss.sessionStateProblem(ctx, "resume session", rec.ID, err)
}

// sessionStateProblem maps the catalog's answers about a session's state
// to problems: not found, ended (410), the store's.
func (ss *sessions) sessionStateProblem(ctx context.Context, op, id string, err error) *problem {
	var ended *cache.SessionEndedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ended):
		return sessionEnded(id, ended.Reason)
	case errors.Is(err, cache.ErrNotFound):
		return sessionNotFound(id)
	}
	return ss.problems.storeProblem(ctx, op, err)
}
