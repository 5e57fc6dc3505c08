package producer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Calls into a session: accepted in order into the catalog (EnqueueCall),
// run by the worker holding the session, and answered once they end or a
// wait passes; their results and live events are read by seq.

// callAnswer is a session call as the API answers it: its result once it
// has ended, else where it stands.
type callAnswer struct {
	res     job.CallResult
	pending *job.CallPending
}

// writeCallAnswer answers 200 with the call's result, or 202 with its
// pending body and Location.
func writeCallAnswer(w http.ResponseWriter, a callAnswer) {
	if a.pending != nil {
		w.Header().Set("Location", a.pending.Links.Self)
		writeJSON(w, http.StatusAccepted, a.pending)
		return
	}
	writeJSON(w, http.StatusOK, a.res)
}

// sessionHolderCheck is how often a wait for a session's call asks whether
// the session's worker still holds it.
const sessionHolderCheck = time.Second

// callOf is nil when session rec has a call seq (written text), else the
// problem to answer.
func callOf(rec cache.SessionRecord, seq int64, text string) *problem {
	if seq < 1 || seq > rec.Seq {
		return newProblem(http.StatusNotFound, job.ProblemNotFound, "Call not found",
			fmt.Sprintf("session %s has no call %q: its calls are numbered 1 .. %d", rec.ID, text, rec.Seq))
	}
	return nil
}

// pathCall is the call a request's path names ({id}, {seq}): its session
// id, its number (0 when {seq} is not one) and {seq} as written.
func pathCall(r *http.Request) (string, int64, string) {
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil {
		seq = 0
	}
	return r.PathValue("id"), seq, r.PathValue("seq")
}

// callRoutes serve a session's calls: read one, cancel one.
type callRoutes struct{ ss *sessions }

func (cr callRoutes) handleSessionCall(w http.ResponseWriter, r *http.Request, caller string) {
	wait, p := cr.ss.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	cr.answerCall(w, r, caller, wait)
}

// handleSessionCallCancel cancels call seq of a session (interruptCall:
// withdrawn while it waits, interrupted while it runs, left as it is once
// it ended) and answers as GET .../calls/{seq} does.
func (cr callRoutes) handleSessionCallCancel(w http.ResponseWriter, r *http.Request, caller string) {
	wait, p := cr.ss.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	id, seq, text := pathCall(r)
	if p := cr.ss.interruptCall(r.Context(), caller, id, seq, text); p != nil {
		writeProblem(w, p)
		return
	}
	cr.answerCall(w, r, caller, wait)
}

// answerCall answers with call seq of the session the request names, its
// result or, when it has not ended within wait, where it stands.
func (cr callRoutes) answerCall(w http.ResponseWriter, r *http.Request, caller string, wait time.Duration) {
	id, seq, text := pathCall(r)
	st, rec, _, p := cr.ss.sessionCall(r.Context(), caller, id, seq, text)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var done chan *nats.Msg
	if wait > 0 {
		done = make(chan *nats.Msg, 64)
		sub, err := cr.ss.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
		if err == nil {
			defer sub.Unsubscribe()
		}
	}
	ans, p := cr.ss.awaitCall(r.Context(), st, rec.ID, seq, wait, done)
	if p != nil {
		writeProblem(w, p)
		return
	}
	writeCallAnswer(w, ans)
}

func cmpProblem(ps ...*problem) *problem {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

func (sr sessionRoutes) handleSessionExec(w http.ResponseWriter, r *http.Request, caller string) {
	var call job.SessionCall
	if wait, ok := sr.ss.waitAndBody(w, r, &call, sessionCallSchema); ok {
		sr.execCall(w, r, caller, call, wait)
	}
}

// waitAndBody reads a session request's ?wait= and its JSON body into v,
// checked against schema; false once it has answered a problem.
func (ss *sessions) waitAndBody(w http.ResponseWriter, r *http.Request, v any, schema *fieldSchema) (time.Duration, bool) {
	wait, p := ss.waits.parseWait(r)
	if p == nil {
		var raw []byte
		if raw, p = readBody(w, r, ss.cfg.MaxBodyBytes); p == nil {
			p = decodeChecked(raw, v, schema, "")
		}
	}
	if p != nil {
		writeProblem(w, p)
		return 0, false
	}
	return wait, true
}

// traced is r's context with the trace context its client sent, if any:
// a session call's trace continues the caller's.
func (ss *sessions) traced(r *http.Request) context.Context {
	return ss.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}

// execCall accepts call into caller's session and answers its result once
// it has ended, or 202 when wait passes first.
func (sr sessionRoutes) execCall(w http.ResponseWriter, r *http.Request, caller string, call job.SessionCall, wait time.Duration) {
	ans, p := sr.ss.runSessionCall(sr.ss.traced(r), caller, r.PathValue("id"), call, r.Header.Get("Idempotency-Key"), wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	writeCallAnswer(w, ans)
}

// runSessionCall accepts call into caller's session id and returns its
// result once it has ended, or where it stands when wait passes first.
// The call is one trace: this span (session.call) from acceptance to the
// answer, and the worker's run of the call (execute) below it.
func (ss *sessions) runSessionCall(ctx context.Context, caller, id string, call job.SessionCall, idem string, wait time.Duration) (_ callAnswer, p *problem) {
	ctx, span := ss.tracer.Start(ctx, ktrace.SpanSessionCall, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(ktrace.SessionIDKey.String(id)))
	defer func() {
		if p != nil {
			span.SetAttributes(attribute.Int("http.response.status_code", p.Status))
			if p.Status >= 500 {
				span.SetStatus(codes.Error, p.Detail)
			}
		}
		span.End()
	}()
	var queued bool
	st, p := ss.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = ss.sessionOf(ctx, st, caller, id)
	}
	if p != nil {
		return callAnswer{}, p
	}
	if why := rec.Expired(ss.cfg.Now()); why != "" {
		if _, err := st.EndSession(ctx, rec.ID, caller, why); err == nil && rec.Worker != "" {
			_ = ss.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
		}
		return callAnswer{}, sessionEnded(rec.ID, why)
	}
	if call.Limits.MemoryMB != 0 {
		return callAnswer{}, ss.problems.toProblem(ctx, "exec", &job.InvalidError{Field: "limits.memory_mb",
			Message: "a call's memory is the session's: set memory_mb when creating the session"})
	}
	call = call.UnderEnv(rec.Env)
	spec := call.Spec(rec.Runtime, rec.Limits)
	span.SetAttributes(ktrace.RuntimeKey.String(rec.Runtime), ktrace.CodeSHA256Key.String(job.CodeSHA256(spec.Code)))
	if call.File == nil && call.Command == nil { // no code of the client's (sessions_files.go, sessions_commands.go)
		if err := spec.Validate(); err != nil {
			return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
		}
	}
	if rt, err := ss.runtimes.lookup(ctx, rec.Runtime); err != nil {
		return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
	} else if _, err := rt.Limits.Resolve(call.Limits); err != nil {
		return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
	} else if err := (job.Spec{Runtime: rec.Runtime, Env: call.Env}).ValidateFor(rt.RuntimeContract); err != nil {
		return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
	}
	// The tenant's submission rate and CPU-seconds-per-day quota hold
	// session calls as they hold jobs (a call's CPU is charged by the worker).
	if err := ss.tenants.admit(ctx, caller); err != nil {
		return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
	}
	if rec, p = ss.ensureHeld(ctx, st, rec); p != nil {
		return callAnswer{}, p
	}
	// A call charged to a budget holds one run of it from now; the worker
	// settles what the call used. A call that is not queued (refused, or
	// the same Idempotency-Key's call already is) gives it back.
	call = call.Sent()
	call.Redact, call.Quota, call.EventsID = ss.tenants.tenant(caller).Redact, ss.tenants.workerQuota(caller), job.NewID()
	call.Trace = ktrace.InjectMap(ctx, ss.prop)
	charge := call.Budget != ""
	if charge && idem != "" {
		// A retry of a call already accepted is answered from it, and
		// charged nothing more.
		_, seen, err := st.CallByIdempotencyKey(ctx, rec.ID, idem)
		if err != nil {
			return callAnswer{}, ss.problems.storeProblem(ctx, "exec", err)
		}
		charge = !seen
	}
	if charge {
		call.Budget = spec.Budget
		resolved := spec
		if rt, err := ss.runtimes.lookup(ctx, rec.Runtime); err == nil {
			if lim, err := rt.Limits.Resolve(spec.Limits); err == nil {
				resolved.Limits = lim
			}
		}
		holdID := job.NewID()
		hold, err := ss.budgets.holdBudget(ctx, caller, holdID, resolved)
		if err != nil {
			var r *refusal
			if errors.As(err, &r) && r.kind == errBudgetExhausted {
				ss.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditBudgetRefusal, SessionID: rec.ID, Runtime: rec.Runtime,
					CodeSHA256: job.CodeSHA256(spec.Code), Inputs: specInputs(spec), Budget: spec.Budget, Detail: r.detail})
			}
			return callAnswer{}, ss.problems.toProblem(ctx, "exec", err)
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
	sub, err := ss.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
	if err != nil {
		return callAnswer{}, ss.problems.storeProblem(ctx, "exec", err)
	}
	defer sub.Unsubscribe()
	// Recorded whatever the caller does meanwhile: a call the store took
	// is answered with its seq (awaitCall), never an error that hides it
	// from a caller that withdraws its call on leaving (e2bapi's).
	seq, dup, err := st.EnqueueCall(context.WithoutCancel(ctx), caller, rec.ID, call, idem, job.SessionQueueMax, ss.cfg.Now())
	queued = err == nil && !dup
	if err == nil {
		span.SetAttributes(ktrace.CallSeqKey.Int64(seq))
	}
	if queued {
		ss.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditSessionCall, SessionID: rec.ID, Call: seq, Runtime: rec.Runtime,
			Digest: rec.Image.Digest, CodeSHA256: job.CodeSHA256(spec.Code), Inputs: specInputs(spec), Budget: spec.Budget,
			Detail: cmp.Or(call.File.Describe(), call.Command.Describe())})
	}
	var ended *cache.SessionEndedError
	switch {
	case errors.As(err, &ended):
		return callAnswer{}, sessionEnded(rec.ID, ended.Reason)
	case errors.Is(err, cache.ErrNotFound):
		return callAnswer{}, sessionNotFound(rec.ID)
	case errors.Is(err, cache.ErrSessionKeyReused):
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemIdempotencyKeyReused, "Idempotency-Key reused",
			fmt.Sprintf("this Idempotency-Key was sent with another call (call %d of session %s); send a new key for a new call", seq, rec.ID))
		p.Field = "Idempotency-Key"
		return callAnswer{}, p
	case errors.Is(err, cache.ErrSessionQueueFull):
		p := newProblem(http.StatusTooManyRequests, job.ProblemQueueFull, "Session busy",
			fmt.Sprintf("session %s already has %d calls waiting or running, the most it queues; wait for one to end", rec.ID, job.SessionQueueMax))
		p.Limit, p.retryAfter = job.SessionQueueMax, ss.cfg.RetryAfter
		return callAnswer{}, p
	case err != nil:
		return callAnswer{}, ss.problems.storeProblem(ctx, "exec", err)
	}
	_ = ss.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
	return ss.awaitCall(ctx, st, rec.ID, seq, wait, done)
}

// awaitCall waits (at most wait) for call seq of session id: its result
// once ended, else where it stands. While it waits it checks every
// sessionHolderCheck that the session's worker still holds the session, and
// brings the session back on another worker when it does not: the call is
// then run there (or, if it had started, answered as interrupted), without
// waiting for another call to notice the loss.
func (ss *sessions) awaitCall(ctx context.Context, st SessionStore, id string, seq int64, wait time.Duration, done <-chan *nats.Msg) (callAnswer, *problem) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	check := time.NewTicker(sessionHolderCheck)
	defer check.Stop()
	state := ""
	for {
		c, err := st.SessionCall(ctx, id, seq)
		if err != nil && ctx.Err() != nil {
			// The caller went away as the call was read: it stands
			// where it was last seen (a caller that withdraws it on
			// leaving, e2bapi's, needs its seq).
			break
		}
		if err != nil {
			return callAnswer{}, ss.problems.storeProblem(ctx, "read call", err)
		}
		if c.Result != nil {
			return callAnswer{res: *c.Result}, nil
		}
		state = c.State
		if done == nil {
			break
		}
		select {
		case <-done:
			continue
		case <-check.C:
			ss.keepHeld(ctx, st, id)
			continue
		case <-deadline.C:
		case <-ctx.Done():
		case <-ss.waits.done.Done():
		}
		break
	}
	pending := job.NewCallPending(id, seq, state)
	return callAnswer{pending: &pending}, nil
}

// keepHeld brings session id back on a live worker when the process
// holding it is gone (ensureHeld, for a wait). A failure is logged: the
// wait goes on, and the next check tries again.
func (ss *sessions) keepHeld(ctx context.Context, st SessionStore, id string) {
	rec, err := st.Session(ctx, id)
	if err != nil || rec.Status == job.SessionEnded {
		return
	}
	if _, p := ss.ensureHeld(ctx, st, rec); p != nil {
		ss.log.WarnContext(ctx, "bring a session back for a call waiting on it", slog.String("session_id", id), slog.String("problem", p.Detail))
	}
}

// sessionCall is the caller's session id and the record of its call seq
// (as the client wrote it: text, or "" for seq itself), or the problem to
// answer.
func (ss *sessions) sessionCall(ctx context.Context, caller, id string, seq int64, text string) (SessionStore, cache.SessionRecord, cache.SessionCallRecord, *problem) {
	st, p := ss.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = ss.sessionOf(ctx, st, caller, id)
	}
	if text == "" {
		text = strconv.FormatInt(seq, 10)
	}
	if p == nil {
		p = callOf(rec, seq, text)
	}
	if p != nil {
		return nil, rec, cache.SessionCallRecord{}, p
	}
	c, err := st.SessionCall(ctx, rec.ID, seq)
	if err != nil {
		return nil, rec, c, ss.problems.storeProblem(ctx, "read call", err)
	}
	return st, rec, c, nil
}

// callEnded is the done of a reading of call seq's events: it reads the
// call's record into *c and, while the call has not ended, brings the
// session back should its worker be gone, as a wait for the call does
// (awaitCall), so a reader is answered without another call being sent.
func (ss *sessions) callEnded(st SessionStore, id string, seq int64, c *cache.SessionCallRecord) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		var err error
		if *c, err = st.SessionCall(ctx, id, seq); err != nil {
			return false
		}
		if c.Result == nil {
			ss.keepHeld(ctx, st, id)
		}
		return c.Result != nil
	}
}

// handleSessionCallEvents streams call seq of a session as server-sent
// events, as GET /v1/jobs/{id}/events does a job: its status, its output as
// it is written (redacted), then its result.
func (sr sessionRoutes) handleSessionCallEvents(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	skip, p := lastEventID(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	sid, seq, text := pathCall(r)
	st, rec, c, p := sr.ss.sessionCall(ctx, caller, sid, seq, text)
	if p != nil {
		writeProblem(w, p)
		return
	}
	id := c.Spec.EventsID
	if !job.ValidID(id) {
		// A call accepted before calls had events: its result only.
		id = job.NewID()
	}
	done := sr.ss.callEnded(st, rec.ID, seq, &c)
	// A call that has ended still streams its events, from the events
	// stream's retention, before its result.
	sr.ss.events.streamEvents(w, r, caller, id, skip, c.Spec.EventsID == "", done,
		func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController) {
			if c.Result == nil && !done(ctx) {
				return
			}
			b, _ := json.Marshal(c.Result)
			_ = writeSSE(w, rc, eventsResultID, job.EventResult, b)
		})
}

// interruptCall is InterruptCall, with seq's text as the request named it
// (for the refusal of a seq that names no call).
func (ss *sessions) interruptCall(ctx context.Context, tenant, id string, seq int64, text string) *problem {
	st, rec, c, p := ss.sessionCall(ctx, tenant, id, seq, text)
	if p != nil {
		return p
	}
	if c.Result != nil || !job.ValidID(c.Spec.EventsID) {
		return nil
	}
	if c.State != job.CallRunning {
		withdrawn, err := st.WithdrawCall(ctx, rec.ID, seq)
		if err != nil {
			return ss.problems.storeProblem(ctx, "withdraw call", err)
		}
		if withdrawn {
			ss.audit.appendAudit(ctx, tenant, job.AuditRecord{Kind: job.AuditCancel, JobID: c.Spec.EventsID, SessionID: rec.ID, Call: seq, Status: job.StatusQueued})
			return nil
		}
		// It started meanwhile: interrupted as a running one.
	}
	ss.audit.appendAudit(ctx, tenant, job.AuditRecord{Kind: job.AuditCancel, JobID: c.Spec.EventsID, SessionID: rec.ID, Call: seq, Status: job.StatusRunning})
	if err := ss.nc.Publish(job.CancelSubject, []byte(c.Spec.EventsID)); err != nil {
		return ss.problems.storeProblem(ctx, "interrupt call", fmt.Errorf("%w: %w", cache.ErrUnavailable, err))
	}
	return nil
}
