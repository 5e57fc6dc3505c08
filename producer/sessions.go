package producer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Sessions (job/session.go, worker/session.go): the API keeps the session
// catalog in the Store, asks the fleet for a session's box over NATS, and
// accepts calls into the catalog in order; the worker holding the session
// runs them. A session whose worker is gone (its lease lapsed, or another
// process holds its id) is asked for again on its next call, and comes
// back on a worker with room.

// SessionStore is the part of cache.Store sessions use; a Store without it
// answers 501 on every session endpoint.
type SessionStore interface {
	CreateSession(ctx context.Context, r cache.SessionRecord, maxLive int) error
	Session(ctx context.Context, id string) (cache.SessionRecord, error)
	TenantSessions(ctx context.Context, tenant string, now time.Time) ([]cache.SessionRecord, error)
	EnqueueCall(ctx context.Context, tenant, id string, call job.SessionCall, idemKey string, queueMax int, now time.Time) (int64, bool, error)
	CallByIdempotencyKey(ctx context.Context, id, idemKey string) (int64, bool, error)
	SessionCall(ctx context.Context, id string, seq int64) (cache.SessionCallRecord, error)
	EndSession(ctx context.Context, id, tenant, reason string) (bool, error)
	WorkerInstance(ctx context.Context, id string) (string, error)
}

// typeSessionEnded is the problem type of a call to a session that ended.
const typeSessionEnded = string(job.ProblemSessionEnded)

// Defaults of the session settings of Config.
const (
	SessionsPerTenantDefault = 10
	sessionOpenTimeout       = 2 * time.Minute
	sessionOpenTries         = 4
	sessionNoWorkerWait      = 15 * time.Second
	sessionFileMax           = 64 << 20
)

var (
	sessionSpecSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"runtime": nil, "limits": limitsSchema, "memory_mb": nil, "idle_timeout_s": nil, "max_lifetime_s": nil,
		"files": {elem: fileSchema}, "restore": nil, "network": networkSchema,
	}}
	sessionCallSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"code": nil, "stdin": nil, "args": nil, "env": {mapNames: true}, "files": {elem: fileSchema}, "limits": limitsSchema,
		"budget": nil,
	}}
)

func sessionLinks(id string) map[string]string {
	base := "/v1/sessions/" + id
	return map[string]string{"self": base, "exec": base + "/exec", "files": base + "/files/"}
}

func sessionNotFound(id string) *problem {
	return newProblem(http.StatusNotFound, typeNotFound, "Session not found",
		fmt.Sprintf("no session %s: it never existed, its record expired, or it is another tenant's", id))
}

func sessionEnded(id, reason string) *problem {
	what := map[string]string{
		job.SessionEndDeleted:     "it was deleted",
		job.SessionEndIdle:        "it was idle longer than its idle_timeout_s",
		job.SessionEndLifetime:    "it reached its max_lifetime_s",
		job.SessionEndUnavailable: "no worker could make its sandbox",
	}[reason]
	if what == "" {
		what = reason
	}
	return newProblem(http.StatusGone, typeSessionEnded, "Session ended",
		fmt.Sprintf("session %s has ended: %s; create a new session (POST /v1/sessions)", id, what))
}

func (s *Server) sessionStore() (SessionStore, *problem) {
	st, ok := s.store.(SessionStore)
	if !ok {
		return nil, newProblem(http.StatusNotImplemented, typeInternal, "Sessions unavailable", "this API's store does not keep sessions")
	}
	return st, nil
}

// sessionOf reads caller's session id: another tenant's is not found.
func (s *Server) sessionOf(ctx context.Context, st SessionStore, caller, id string) (cache.SessionRecord, *problem) {
	if !job.ValidID(id) {
		return cache.SessionRecord{}, sessionNotFound(id)
	}
	rec, err := st.Session(ctx, id)
	if errors.Is(err, cache.ErrNotFound) || (err == nil && rec.Tenant != caller) {
		return rec, sessionNotFound(id)
	}
	if err != nil {
		return rec, s.storeProblem(ctx, "read session", err)
	}
	return rec, nil
}

func (s *Server) handleSessionCreate(w http.ResponseWriter, r *http.Request, caller string) {
	st, p := s.sessionStore()
	if p != nil {
		writeProblem(w, p)
		return
	}
	raw, p := readBody(w, r, s.cfg.MaxBodyBytes)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var spec job.SessionSpec
	if p := decodeChecked(raw, &spec, sessionSpecSchema, ""); p != nil {
		writeProblem(w, p)
		return
	}
	rec, p := s.createSession(r.Context(), st, caller, spec)
	if p != nil {
		writeProblem(w, p)
		return
	}
	v := rec.View(time.Now())
	v.Links = sessionLinks(rec.ID)
	w.Header().Set("Location", "/v1/sessions/"+rec.ID)
	writeJSON(w, http.StatusCreated, v)
}

// createSession checks spec, records the session and waits for a worker
// to hold it.
func (s *Server) createSession(ctx context.Context, st SessionStore, caller string, spec job.SessionSpec) (cache.SessionRecord, *problem) {
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", err)
	}
	rt, err := s.runtimes.lookup(ctx, spec.Runtime)
	if err != nil {
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", err)
	}
	// The call limits and the session's memory, against the runtime's policy.
	if spec.Limits, err = rt.Limits.Resolve(spec.Limits); err != nil {
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", err)
	}
	mem, err := rt.Limits.Resolve(job.Limits{MemoryMB: spec.MemoryMB})
	if err != nil {
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", fieldRenamed(err, "limits.memory_mb", "memory_mb"))
	}
	if err := (job.Spec{Runtime: spec.Runtime, Code: "pass", Files: spec.Files}).Validate(); err != nil {
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", err)
	}
	if spec.Network, err = s.checkNetwork(caller, spec.Network); err != nil {
		var p *problem
		if errors.As(err, &p) {
			return cache.SessionRecord{}, p // egress-not-allowed
		}
		return cache.SessionRecord{}, s.toProblem(ctx, "create session", err)
	}
	now := time.Now()
	rec := cache.SessionRecord{ID: job.NewID(), Tenant: caller, Runtime: spec.Runtime, Created: now,
		Expires: now.Add(time.Duration(spec.MaxLifetimeS) * time.Second), IdleTimeout: time.Duration(spec.IdleTimeoutS) * time.Second,
		MemoryMB: mem.MemoryMB, Limits: spec.Limits, Restore: spec.Restore, Init: spec.Files, Network: spec.Network}
	if err := st.CreateSession(ctx, rec, s.cfg.SessionsPerTenant); err != nil {
		if errors.Is(err, cache.ErrSessionQuota) {
			p := newProblem(http.StatusTooManyRequests, job.ProblemQuotaPrefix+"sessions", "Too many sessions",
				fmt.Sprintf("this API key has %d live sessions, the most it may hold; delete one (DELETE /v1/sessions/{id}) or let one expire", s.cfg.SessionsPerTenant))
			p.Limit = int64(s.cfg.SessionsPerTenant)
			return rec, p
		}
		return rec, s.storeProblem(ctx, "create session", err)
	}
	if p := s.openSession(ctx, rec); p != nil {
		_, _ = st.EndSession(context.WithoutCancel(ctx), rec.ID, caller, job.SessionEndUnavailable)
		return rec, p
	}
	out, p := s.sessionOf(ctx, st, caller, rec.ID)
	if p == nil {
		ar := job.AuditRecord{Kind: job.AuditSessionCreated, SessionID: rec.ID, Runtime: rec.Runtime, Digest: out.Image.Digest,
			Inputs: specInputs(job.Spec{Files: spec.Files})}
		if !spec.Network.Empty() {
			ar.Detail = "network: " + strings.Join(spec.Network.Allow, ",")
		}
		s.appendAudit(ctx, caller, ar)
	}
	return out, p
}

// fieldRenamed names the session's field in an error about the limits'.
func fieldRenamed(err error, from, to string) error {
	var ie *job.InvalidError
	if errors.As(err, &ie) && ie.Field == from {
		return &job.InvalidError{Field: to, Message: ie.Message}
	}
	return err
}

// openSession asks the fleet for rec's box (a new session, or one whose
// worker was lost) and waits for a worker to hold it.
func (s *Server) openSession(ctx context.Context, rec cache.SessionRecord) *problem {
	req, _ := json.Marshal(job.SessionOpen{ID: rec.ID})
	var last string
	// No worker listening may be a fleet starting up: asked again for a
	// while, with back-off.
	noOne, pause := time.Now().Add(sessionNoWorkerWait), 50*time.Millisecond
	for tries := 0; tries < sessionOpenTries; {
		rctx, cancel := context.WithTimeout(ctx, sessionOpenTimeout)
		msg, err := s.nc.RequestWithContext(rctx, job.SessionOpenPrefix+rec.Runtime, req)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(noOne) {
			last = err.Error()
			select {
			case <-ctx.Done():
				return s.storeProblem(ctx, "open session", ctx.Err())
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
			continue
		}
		tries++
		if err != nil {
			last = err.Error()
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) {
				break
			}
			continue
		}
		var got job.SessionOpened
		if err := json.Unmarshal(msg.Data, &got); err != nil {
			last = err.Error()
			continue
		}
		if got.Error == "" {
			return nil
		}
		if got.Invalid {
			return s.toProblem(ctx, "open session", &job.InvalidError{Field: "runtime", Message: got.Error})
		}
		last = got.Error
	}
	p := newProblem(http.StatusServiceUnavailable, typeUnavailable, "No worker for the session",
		"no worker could hold the session's sandbox now ("+last+"); retry after the Retry-After delay")
	p.retryAfter = s.cfg.RetryAfter
	return p
}

// ensureHeld brings rec back on a live worker when the process holding it
// is gone.
func (s *Server) ensureHeld(ctx context.Context, st SessionStore, rec cache.SessionRecord) (cache.SessionRecord, *problem) {
	inst, err := st.WorkerInstance(ctx, rec.Worker)
	if err != nil {
		return rec, s.storeProblem(ctx, "session worker", err)
	}
	if rec.Worker != "" && inst == rec.Instance && rec.Status != job.SessionStarting {
		return rec, nil
	}
	if p := s.openSession(ctx, rec); p != nil {
		return rec, p
	}
	rec, err = st.Session(ctx, rec.ID)
	if err != nil {
		return rec, s.storeProblem(ctx, "read session", err)
	}
	return rec, nil
}

func (s *Server) handleSessionGet(w http.ResponseWriter, r *http.Request, caller string) {
	st, p := s.sessionStore()
	if p == nil {
		var rec cache.SessionRecord
		if rec, p = s.sessionOf(r.Context(), st, caller, r.PathValue("id")); p == nil {
			v := rec.View(time.Now())
			v.Links = sessionLinks(rec.ID)
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeProblem(w, p)
}

func (s *Server) handleSessionList(w http.ResponseWriter, r *http.Request, caller string) {
	st, p := s.sessionStore()
	if p != nil {
		writeProblem(w, p)
		return
	}
	now := time.Now()
	recs, err := st.TenantSessions(r.Context(), caller, now)
	if err != nil {
		writeProblem(w, s.storeProblem(r.Context(), "list sessions", err))
		return
	}
	out := make([]job.Session, 0, len(recs))
	for _, rec := range recs {
		v := rec.View(now)
		if v.Status == job.SessionEnded {
			continue
		}
		v.Links = sessionLinks(rec.ID)
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

func (s *Server) handleSessionDelete(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if _, err := st.EndSession(ctx, rec.ID, caller, job.SessionEndDeleted); err != nil {
		writeProblem(w, s.storeProblem(ctx, "delete session", err))
		return
	}
	s.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditSessionEnded, SessionID: rec.ID, Detail: job.SessionEndDeleted})
	if rec.Worker != "" {
		_ = s.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
	}
	rec, p = s.sessionOf(ctx, st, caller, rec.ID)
	if p != nil {
		writeProblem(w, p)
		return
	}
	writeJSON(w, http.StatusOK, rec.View(time.Now()))
}

func (s *Server) handleSessionExec(w http.ResponseWriter, r *http.Request, caller string) {
	wait, p := s.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	raw, p := readBody(w, r, s.cfg.MaxBodyBytes)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var call job.SessionCall
	if p := decodeChecked(raw, &call, sessionCallSchema, ""); p != nil {
		writeProblem(w, p)
		return
	}
	s.execCall(w, r, caller, call, wait)
}

// execCall accepts call into caller's session and answers its result once
// it has ended, or 202 when wait passes first.
func (s *Server) execCall(w http.ResponseWriter, r *http.Request, caller string, call job.SessionCall, wait time.Duration) {
	res, p := s.runSessionCall(r.Context(), caller, r.PathValue("id"), call, r.Header.Get("Idempotency-Key"), wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	if res.Pending {
		w.Header().Set("Location", fmt.Sprintf("/v1/sessions/%s/calls/%d", r.PathValue("id"), res.Seq))
		writeJSON(w, http.StatusAccepted, res)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// runSessionCall accepts call into caller's session id and returns its
// result once it has ended, or {seq, pending} when wait passes first.
func (s *Server) runSessionCall(ctx context.Context, caller, id string, call job.SessionCall, idem string, wait time.Duration) (job.CallResult, *problem) {
	var queued bool
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, id)
	}
	if p != nil {
		return job.CallResult{}, p
	}
	if why := rec.Expired(time.Now()); why != "" {
		if _, err := st.EndSession(ctx, rec.ID, caller, why); err == nil && rec.Worker != "" {
			_ = s.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
		}
		return job.CallResult{}, sessionEnded(rec.ID, why)
	}
	if call.Limits.MemoryMB != 0 {
		return job.CallResult{}, s.toProblem(ctx, "exec", &job.InvalidError{Field: "limits.memory_mb",
			Message: "a call's memory is the session's: set memory_mb when creating the session"})
	}
	spec := call.Spec(rec.Runtime, rec.Limits)
	if err := spec.Validate(); err != nil {
		return job.CallResult{}, s.toProblem(ctx, "exec", err)
	}
	if rt, err := s.runtimes.lookup(ctx, rec.Runtime); err != nil {
		return job.CallResult{}, s.toProblem(ctx, "exec", err)
	} else if _, err := rt.Limits.Resolve(call.Limits); err != nil {
		return job.CallResult{}, s.toProblem(ctx, "exec", err)
	}
	// The tenant's submission rate and CPU-seconds-per-day quota hold
	// session calls as they hold jobs (a call's CPU is charged by the worker).
	if err := s.admit(ctx, caller); err != nil {
		return job.CallResult{}, s.toProblem(ctx, "exec", err)
	}
	if rec, p = s.ensureHeld(ctx, st, rec); p != nil {
		return job.CallResult{}, p
	}
	// A call charged to a budget holds one run of it from now; the worker
	// settles what the call used. A call that is not queued (refused, or
	// the same Idempotency-Key's call already is) gives it back.
	call = call.Sent()
	call.Redact, call.EventsID = s.tenant(caller).Redact, job.NewID()
	charge := call.Budget != ""
	if charge && idem != "" {
		// A retry of a call already accepted is answered from it, and
		// charged nothing more.
		_, seen, err := st.CallByIdempotencyKey(ctx, rec.ID, idem)
		if err != nil {
			return job.CallResult{}, s.storeProblem(ctx, "exec", err)
		}
		charge = !seen
	}
	if charge {
		call.Budget = spec.Budget
		resolved := spec
		if rt, err := s.runtimes.lookup(ctx, rec.Runtime); err == nil {
			if lim, err := rt.Limits.Resolve(spec.Limits); err == nil {
				resolved.Limits = lim
			}
		}
		holdID := job.NewID()
		hold, err := s.holdBudget(ctx, caller, holdID, resolved)
		if err != nil {
			var bp *problem
			if errors.As(err, &bp) {
				if bp.Type == typeBudgetExhausted {
					s.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditBudgetRefusal, SessionID: rec.ID, Runtime: rec.Runtime,
						CodeSHA256: job.CodeSHA256(spec.Code), Inputs: specInputs(spec), Budget: spec.Budget, Detail: bp.Detail})
				}
				return job.CallResult{}, bp
			}
			return job.CallResult{}, s.storeProblem(ctx, "exec", err)
		}
		defer hold.done(ctx)
		call.BudgetHold = holdID
		defer func() {
			if queued {
				hold.keep()
			}
		}()
	}
	done := make(chan *nats.Msg, 64)
	sub, err := s.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
	if err != nil {
		return job.CallResult{}, s.storeProblem(ctx, "exec", err)
	}
	defer sub.Unsubscribe()
	seq, dup, err := st.EnqueueCall(ctx, caller, rec.ID, call, idem, job.SessionQueueMax, time.Now())
	queued = err == nil && !dup
	if queued {
		s.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditSessionCall, SessionID: rec.ID, Call: seq, Runtime: rec.Runtime,
			Digest: rec.Image.Digest, CodeSHA256: job.CodeSHA256(spec.Code), Inputs: specInputs(spec), Budget: spec.Budget})
	}
	var ended *cache.SessionEndedError
	switch {
	case errors.As(err, &ended):
		return job.CallResult{}, sessionEnded(rec.ID, ended.Reason)
	case errors.Is(err, cache.ErrNotFound):
		return job.CallResult{}, sessionNotFound(rec.ID)
	case errors.Is(err, cache.ErrSessionKeyReused):
		p := newProblem(http.StatusUnprocessableEntity, typeIdempotencyReused, "Idempotency-Key reused",
			fmt.Sprintf("this Idempotency-Key was sent with another call (call %d of session %s); send a new key for a new call", seq, rec.ID))
		p.Field = "Idempotency-Key"
		return job.CallResult{}, p
	case errors.Is(err, cache.ErrSessionQueueFull):
		p := newProblem(http.StatusTooManyRequests, typeQueueFull, "Session busy",
			fmt.Sprintf("session %s already has %d calls waiting or running, the most it queues; wait for one to end", rec.ID, job.SessionQueueMax))
		p.Limit, p.retryAfter = job.SessionQueueMax, s.cfg.RetryAfter
		return job.CallResult{}, p
	case err != nil:
		return job.CallResult{}, s.storeProblem(ctx, "exec", err)
	}
	_ = s.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
	return s.awaitCall(ctx, st, rec.ID, seq, wait, done)
}

// awaitCall waits (at most wait) for call seq of session id: its result
// once ended, else {seq, pending}.
func (s *Server) awaitCall(ctx context.Context, st SessionStore, id string, seq int64, wait time.Duration, done <-chan *nats.Msg) (job.CallResult, *problem) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		c, err := st.SessionCall(ctx, id, seq)
		if err != nil {
			return job.CallResult{}, s.storeProblem(ctx, "read call", err)
		}
		if c.Result != nil {
			return *c.Result, nil
		}
		if done == nil {
			break
		}
		select {
		case <-done:
			continue
		case <-deadline.C:
		case <-ctx.Done():
		case <-s.waitsDone.Done():
		}
		break
	}
	return job.CallResult{Seq: seq, Pending: true}, nil
}

// sessionCallOf is the caller's session and the call r's path names in it
// ({id}, {seq}), or the problem to answer (an earlier one, p, first).
func (s *Server) sessionCallOf(r *http.Request, caller string, p *problem) (SessionStore, cache.SessionRecord, int64, *problem) {
	st, p2 := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil && p2 == nil {
		rec, p = s.sessionOf(r.Context(), st, caller, r.PathValue("id"))
	}
	if p = cmpProblem(p, p2); p != nil {
		return nil, rec, 0, p
	}
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq < 1 || seq > rec.Seq {
		return nil, rec, 0, newProblem(http.StatusNotFound, typeNotFound, "Call not found",
			fmt.Sprintf("session %s has no call %q: its calls are numbered 1 .. %d", rec.ID, r.PathValue("seq"), rec.Seq))
	}
	return st, rec, seq, nil
}

func (s *Server) handleSessionCall(w http.ResponseWriter, r *http.Request, caller string) {
	wait, p := s.parseWait(r)
	st, rec, seq, p := s.sessionCallOf(r, caller, p)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var done chan *nats.Msg
	if wait > 0 {
		done = make(chan *nats.Msg, 64)
		sub, err := s.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
		if err == nil {
			defer sub.Unsubscribe()
		}
	}
	res, p := s.awaitCall(r.Context(), st, rec.ID, seq, wait, done)
	if p != nil {
		writeProblem(w, p)
		return
	}
	status := http.StatusOK
	if res.Pending {
		status = http.StatusAccepted
	}
	writeJSON(w, status, res)
}

// handleSessionCallEvents streams call seq of a session as server-sent
// events, as GET /v1/jobs/{id}/events does a job: its status, its output as
// it is written (redacted), then its result.
func (s *Server) handleSessionCallEvents(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	skip, p := lastEventID(r)
	st, rec, seq, p := s.sessionCallOf(r, caller, p)
	if p != nil {
		writeProblem(w, p)
		return
	}
	c, err := st.SessionCall(ctx, rec.ID, seq)
	if err != nil {
		writeProblem(w, s.storeProblem(ctx, "read call", err))
		return
	}
	id := c.Spec.EventsID
	if !job.ValidID(id) {
		// A call accepted before calls had events: its result only.
		id = job.NewID()
	}
	done := func(ctx context.Context) bool {
		c, err = st.SessionCall(ctx, rec.ID, seq)
		return err == nil && c.Result != nil
	}
	// A call that has ended still streams its events, from the events
	// stream's retention, before its result.
	s.streamEvents(w, r, caller, id, skip, c.Spec.EventsID == "", done,
		func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController) {
			if c.Result == nil && !done(ctx) {
				return
			}
			b, _ := json.Marshal(c.Result)
			_ = writeSSE(w, rc, eventsResultID, job.EventResult, b)
		})
}

func cmpProblem(ps ...*problem) *problem {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

// handleSessionFileGet answers a file of the session's /work as its last
// call left it (the checkpoint).
func (s *Server) handleSessionFileGet(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	name := r.PathValue("path")
	if err := job.ValidSessionFilePath(name); err != nil {
		writeProblem(w, s.toProblem(ctx, "session file", err))
		return
	}
	for _, f := range rec.Files {
		if f.Name != name {
			continue
		}
		o, err := s.blobs.Open(ctx, job.ObjectRef{Tenant: rec.Tenant, SHA256: f.SHA256, Size: f.Size})
		if err != nil {
			writeProblem(w, s.storeProblem(ctx, "session file", err))
			return
		}
		defer o.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
		w.Header().Set("ETag", `"`+f.SHA256+`"`)
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, o)
		return
	}
	writeProblem(w, newProblem(http.StatusNotFound, typeNotFound, "File not found",
		fmt.Sprintf("session %s has no file %q in /work after its last call", rec.ID, name)))
}

// handleSessionFilePut writes a file into the session's /work: a call of
// the session (it takes the next seq), so it is ordered with the calls.
func (s *Server) handleSessionFilePut(w http.ResponseWriter, r *http.Request, caller string) {
	name := r.PathValue("path")
	if err := job.ValidSessionFilePath(name); err != nil {
		writeProblem(w, s.toProblem(r.Context(), "session file", err))
		return
	}
	r.Header.Del("Content-Type") // any media type: the body is the file
	body, p := readBody(w, r, min(s.cfg.MaxBodyBytes, sessionFileMax))
	if p != nil {
		writeProblem(w, p)
		return
	}
	call := job.SessionCall{Code: "pass", Files: []job.File{{Name: name, Content: base64.StdEncoding.EncodeToString(body), Encoding: "base64"}}}
	s.execCall(w, r, caller, call, s.cfg.MaxWait)
}
