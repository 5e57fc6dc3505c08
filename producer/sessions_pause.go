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

// handleSessionPause pauses the caller's session once the calls accepted
// before it have ended: 200 with the session once paused, or 202 with it
// when ?wait passes first (it pauses when they end).
func (s *Server) handleSessionPause(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	wait, p := s.waits.parseWait(r)
	st, p2 := s.sessionStore()
	var rec cache.SessionRecord
	if p = cmpProblem(p, p2); p == nil {
		rec, p = s.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if r.URL.Query().Get("wait") == "" {
		wait = s.cfg.MaxWait
	}
	rec, paused, p := s.pauseSession(ctx, st, rec, wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	v := rec.View(s.cfg.Now())
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
func (s *Server) pauseSession(ctx context.Context, st SessionStore, rec cache.SessionRecord, wait time.Duration) (cache.SessionRecord, bool, *problem) {
	done := make(chan *nats.Msg, 8)
	sub, err := s.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
	if err != nil {
		return rec, false, s.problems.storeProblem(ctx, "pause session", err)
	}
	defer sub.Unsubscribe()
	already, err := st.RequestPause(ctx, rec.Tenant, rec.ID)
	if p := s.sessionStateProblem(ctx, "pause session", rec.ID, err); p != nil {
		return rec, false, p
	}
	if !already {
		held, err := s.holds(ctx, st, rec)
		switch {
		case err != nil:
			return rec, false, s.problems.storeProblem(ctx, "pause session", err)
		case held:
			_ = s.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
		default:
			h := cache.SessionHolder{Worker: rec.Worker, Instance: rec.Instance, Inc: rec.Inc}
			if err := st.PauseHeld(ctx, rec.Tenant, rec.ID, h, s.cfg.Now()); err != nil && !errors.Is(err, cache.ErrSessionFenced) {
				return rec, false, s.sessionStateProblem(ctx, "pause session", rec.ID, err)
			}
		}
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		rec, err = st.Session(ctx, rec.ID)
		if err != nil {
			return rec, false, s.problems.storeProblem(ctx, "pause session", err)
		}
		if rec.Status == job.SessionPaused || rec.Status == job.SessionEnded {
			if rec.Status == job.SessionPaused {
				s.audit.appendAudit(ctx, rec.Tenant, job.AuditRecord{Kind: job.AuditSessionPaused, SessionID: rec.ID})
			}
			return rec, rec.Status == job.SessionPaused, nil
		}
		select {
		case <-done:
		case <-deadline.C:
			return rec, false, nil
		case <-ctx.Done():
			return rec, false, nil
		case <-s.waits.done.Done():
			return rec, false, nil
		}
	}
}

// handleSessionResume brings the caller's paused session back on a worker
// and answers it with what came back (restored); a session that is not
// paused is answered as it is.
func (s *Server) handleSessionResume(w http.ResponseWriter, r *http.Request, caller string) {
	v, p := (&Domain{s: s}).resumeSession(r.Context(), caller, r.PathValue("id"))
	if p != nil {
		writeProblem(w, p)
		return
	}
	v.Links = sessionLinks(v.ID)
	writeJSON(w, http.StatusOK, v)
}

// resumeSession brings caller's paused session id back on a worker; a
// session that is not paused is answered as it is.
func (d *Domain) resumeSession(ctx context.Context, caller, id string) (job.Session, *problem) {
	s := d.s
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, id)
	}
	if p == nil && rec.Status == job.SessionEnded {
		p = sessionEnded(rec.ID, rec.EndedReason)
	}
	if p == nil {
		rec, p = s.ensureHeld(ctx, st, rec)
	}
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, rec.ID)
	}
	if p != nil {
		return job.Session{}, p
	}
	return rec.View(s.cfg.Now()), nil
}

// resumeIfPaused makes rec, when paused, one of its tenant's live sessions
// again so that a worker may claim it; at the tenant's bound of live
// sessions it answers 429.
func (s *Server) resumeIfPaused(ctx context.Context, st SessionStore, rec cache.SessionRecord) *problem {
	if rec.Status != job.SessionPaused {
		return nil
	}
	resumed, err := st.Resume(ctx, rec.Tenant, rec.ID, s.cfg.SessionsPerTenant, s.cfg.Now())
	if resumed {
		s.audit.appendAudit(ctx, rec.Tenant, job.AuditRecord{Kind: job.AuditSessionResumed, SessionID: rec.ID})
	}
	if errors.Is(err, cache.ErrSessionQuota) {
		p := newProblem(http.StatusTooManyRequests, job.ProblemQuotaPrefix+"sessions", "Too many sessions",
			fmt.Sprintf("session %s is paused, and this API key has %d live sessions, the most it may hold: pause or delete one (POST /v1/sessions/{id}/pause, DELETE /v1/sessions/{id}) before resuming this one",
				rec.ID, s.cfg.SessionsPerTenant))
		p.Limit = int64(s.cfg.SessionsPerTenant)
		return p
	}
	return s.sessionStateProblem(ctx, "resume session", rec.ID, err)
}

// sessionStateProblem maps the catalog's answers about a session's state
// to problems: not found, ended (410), the store's.
func (s *Server) sessionStateProblem(ctx context.Context, op, id string, err error) *problem {
	var ended *cache.SessionEndedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ended):
		return sessionEnded(id, ended.Reason)
	case errors.Is(err, cache.ErrNotFound):
		return sessionNotFound(id)
	}
	return s.problems.storeProblem(ctx, op, err)
}
