package producer

import (
	"context"
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
	WithdrawCall(ctx context.Context, id string, seq int64) (bool, error)
	EndSession(ctx context.Context, id, tenant, reason string) (bool, error)
	WorkerInstance(ctx context.Context, id string) (string, error)
	RequestPause(ctx context.Context, tenant, id string) (paused bool, err error)
	PauseHeld(ctx context.Context, tenant, id string, h cache.SessionHolder, now time.Time) error
	Resume(ctx context.Context, tenant, id string, maxLive int, now time.Time) (resumed bool, err error)
}

// Defaults of the session settings of Config.
const (
	SessionsPerTenantDefault = 10
	// SessionWorkerLapseDefault is the default of Config.SessionWorkerLapse.
	SessionWorkerLapseDefault = 10 * time.Second
	sessionOpenTimeout        = 2 * time.Minute
	sessionOpenTries          = 4
	sessionNoWorkerWait       = 15 * time.Second
	sessionFileMax            = 64 << 20
)

var (
	sessionSpecSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"runtime": nil, "limits": limitsSchema, "memory_mb": nil, "idle_timeout_s": nil, "max_lifetime_s": nil,
		"files": {elem: fileSchema}, "restore": nil, "network": networkSchema, "metadata": {mapNames: true}, "env": {mapNames: true},
	}}
	sessionCallSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"code": nil, "stdin": nil, "args": nil, "env": {mapNames: true}, "files": {elem: fileSchema}, "limits": limitsSchema,
		"budget": nil,
	}}
)

// sessions are the API's side of sessions: the catalog's records, asking
// the fleet for a session's box and knowing who holds it
// (sessions_holder.go), calls accepted in order (sessions_calls.go), pause
// and resume (sessions_pause.go). Their routes are sessionRoutes,
// callRoutes, commandRoutes and fileRoutes.
type sessions struct {
	cfg      *Config
	store    Store
	nc       *nats.Conn
	runtimes *registry
	tenants  *tenants
	budgets  *budgets
	audit    *auditLog
	waits    *waits
	events   *eventStreams
	problems *problems
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	log      *slog.Logger
	// lapses are the sessions' workers whose leases were found missing
	// while they did not answer (sessions_holder.go).
	lapses workerLapses
}

// sessionRoutes serve sessions and their calls' routes: create, list, read,
// delete, exec, pause, resume, a call's events.
type sessionRoutes struct{ ss *sessions }

func sessionLinks(id string) map[string]string {
	base := "/v1/sessions/" + id
	return map[string]string{"self": base, "exec": base + "/exec", "files": base + "/files", "pause": base + "/pause", "resume": base + "/resume"}
}

func sessionNotFound(id string) *problem {
	return newProblem(http.StatusNotFound, job.ProblemNotFound, "Session not found",
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
	return newProblem(http.StatusGone, job.ProblemSessionEnded, "Session ended",
		fmt.Sprintf("session %s has ended: %s; create a new session (POST /v1/sessions)", id, what))
}

// fieldRenamed names the session's field in an error about the limits'.
func fieldRenamed(err error, from, to string) error {
	var ie *job.InvalidError
	if errors.As(err, &ie) && ie.Field == from {
		return &job.InvalidError{Field: to, Message: ie.Message}
	}
	return err
}

// listSessions is caller's live sessions (at most SessionsPerTenant),
// oldest first, those whose metadata holds every tag.
func (ss *sessions) listSessions(ctx context.Context, caller string, tags job.Metadata) ([]job.Session, *problem) {
	st, p := ss.sessionStore()
	if p != nil {
		return nil, p
	}
	now := ss.cfg.Now()
	recs, err := st.TenantSessions(ctx, caller, now)
	if err != nil {
		return nil, ss.problems.storeProblem(ctx, "list sessions", err)
	}
	out := make([]job.Session, 0, len(recs))
	for _, rec := range recs {
		v := rec.View(now)
		if v.Status == job.SessionEnded || !v.Metadata.Matches(tags) {
			continue
		}
		out = append(out, v)
	}
	return out, nil
}

// deleteSession ends caller's session id and tells its worker.
func (ss *sessions) deleteSession(ctx context.Context, caller, id string) (job.Session, *problem) {
	st, p := ss.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = ss.sessionOf(ctx, st, caller, id)
	}
	if p != nil {
		return job.Session{}, p
	}
	if _, err := st.EndSession(ctx, rec.ID, caller, job.SessionEndDeleted); err != nil {
		return job.Session{}, ss.problems.storeProblem(ctx, "delete session", err)
	}
	ss.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditSessionEnded, SessionID: rec.ID, Detail: job.SessionEndDeleted})
	if rec.Worker != "" {
		_ = ss.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(rec.ID))
	}
	rec, p = ss.sessionOf(ctx, st, caller, rec.ID)
	if p != nil {
		return job.Session{}, p
	}
	return rec.View(ss.cfg.Now()), nil
}

func (ss *sessions) sessionStore() (SessionStore, *problem) {
	st, ok := ss.store.(SessionStore)
	if !ok {
		return nil, newProblem(http.StatusNotImplemented, job.ProblemInternal, "Sessions unavailable", "this API's store does not keep sessions")
	}
	return st, nil
}

// sessionOf reads caller's session id: another tenant's is not found.
func (ss *sessions) sessionOf(ctx context.Context, st SessionStore, caller, id string) (cache.SessionRecord, *problem) {
	if !job.ValidID(id) {
		return cache.SessionRecord{}, sessionNotFound(id)
	}
	rec, err := st.Session(ctx, id)
	if errors.Is(err, cache.ErrNotFound) || (err == nil && rec.Tenant != caller) {
		return rec, sessionNotFound(id)
	}
	if err != nil {
		return rec, ss.problems.storeProblem(ctx, "read session", err)
	}
	return rec, nil
}

func (sr sessionRoutes) handleSessionCreate(w http.ResponseWriter, r *http.Request, caller string) {
	st, p := sr.ss.sessionStore()
	if p != nil {
		writeProblem(w, p)
		return
	}
	raw, p := readBody(w, r, sr.ss.cfg.MaxBodyBytes)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var spec job.SessionSpec
	if p := decodeChecked(raw, &spec, sessionSpecSchema, ""); p != nil {
		writeProblem(w, p)
		return
	}
	rec, p := sr.ss.createSession(r.Context(), st, caller, spec)
	if p != nil {
		writeProblem(w, p)
		return
	}
	v := rec.View(sr.ss.cfg.Now())
	v.Links = sessionLinks(rec.ID)
	w.Header().Set("Location", "/v1/sessions/"+rec.ID)
	writeJSON(w, http.StatusCreated, v)
}

// createSession checks spec, records the session and waits for a worker
// to hold it.
func (ss *sessions) createSession(ctx context.Context, st SessionStore, caller string, spec job.SessionSpec) (cache.SessionRecord, *problem) {
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	rt, err := ss.runtimes.lookup(ctx, spec.Runtime)
	if err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	if err := ss.runtimes.hostsSessions(ctx, rt); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	// The env, against the runtime's own reserved names too.
	if err := (job.Spec{Runtime: spec.Runtime, Env: spec.Env}).ValidateFor(rt.RuntimeContract); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	// The call limits and the session's memory, against the runtime's policy.
	if spec.Limits, err = rt.Limits.Resolve(spec.Limits); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	mem, err := rt.Limits.Resolve(job.Limits{MemoryMB: spec.MemoryMB})
	if err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", fieldRenamed(err, "limits.memory_mb", "memory_mb"))
	}
	if err := (job.Spec{Runtime: spec.Runtime, Code: "pass", Files: spec.Files, Env: spec.Env}).Validate(); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	if spec.Network, err = ss.tenants.checkNetwork(caller, spec.Network); err != nil {
		return cache.SessionRecord{}, ss.problems.toProblem(ctx, "create session", err)
	}
	now := ss.cfg.Now()
	rec := cache.SessionRecord{ID: job.NewID(), Tenant: caller, Runtime: spec.Runtime, Created: now,
		Expires: now.Add(time.Duration(spec.MaxLifetimeS) * time.Second), IdleTimeout: time.Duration(spec.IdleTimeoutS) * time.Second,
		MemoryMB: mem.MemoryMB, Limits: spec.Limits, Restore: spec.Restore, Init: spec.Files, Network: spec.Network,
		Metadata: spec.Metadata, Env: spec.Env}
	if err := st.CreateSession(ctx, rec, ss.cfg.SessionsPerTenant); err != nil {
		if errors.Is(err, cache.ErrSessionQuota) {
			p := newProblem(http.StatusTooManyRequests, job.ProblemQuotaPrefix+"sessions", "Too many sessions",
				fmt.Sprintf("this API key has %d live sessions, the most it may hold; delete one (DELETE /v1/sessions/{id}) or let one expire", ss.cfg.SessionsPerTenant))
			p.Limit = int64(ss.cfg.SessionsPerTenant)
			return rec, p
		}
		return rec, ss.problems.storeProblem(ctx, "create session", err)
	}
	if p := ss.openSession(ctx, rec); p != nil {
		_, _ = st.EndSession(context.WithoutCancel(ctx), rec.ID, caller, job.SessionEndUnavailable)
		return rec, p
	}
	out, p := ss.sessionOf(ctx, st, caller, rec.ID)
	if p == nil {
		ar := job.AuditRecord{Kind: job.AuditSessionCreated, SessionID: rec.ID, Runtime: rec.Runtime, Digest: out.Image.Digest,
			Inputs: specInputs(job.Spec{Files: spec.Files, Env: spec.Env})}
		if !spec.Network.Empty() {
			ar.Detail = "network: " + strings.Join(spec.Network.Allow, ",")
		}
		ss.audit.appendAudit(ctx, caller, ar)
	}
	return out, p
}

// openSession asks the fleet for rec's box (a new session, or one whose
// worker was lost) and waits for a worker to hold it. Workers that have room
// but not within the tenant's share of their session memory say so; when
// no other answer came, the tenant is at its share (429, not a fault to
// retry).
func (ss *sessions) openSession(ctx context.Context, rec cache.SessionRecord) *problem {
	req, _ := json.Marshal(job.SessionOpen{ID: rec.ID, Tenant: rec.Tenant, MemoryMB: rec.MemoryMB})
	var last string
	tenantFull, other := false, false
	// No worker listening may be a fleet starting up: asked again for a
	// while, with back-off.
	noOne, pause := time.Now().Add(sessionNoWorkerWait), 50*time.Millisecond
	for tries := 0; tries < sessionOpenTries; {
		rctx, cancel := context.WithTimeout(ctx, sessionOpenTimeout)
		msg, err := ss.nc.RequestWithContext(rctx, job.SessionOpenPrefix+rec.Runtime, req)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(noOne) {
			last = err.Error()
			select {
			case <-ctx.Done():
				return ss.problems.storeProblem(ctx, "open session", ctx.Err())
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
			return ss.problems.toProblem(ctx, "open session", &job.InvalidError{Field: "runtime", Message: got.Error})
		}
		if got.TenantFull {
			tenantFull = true
		} else {
			other = true
		}
		last = got.Error
	}
	if tenantFull && !other {
		p := newProblem(http.StatusTooManyRequests, job.ProblemType(job.QuotaProblemType(job.QuotaSessionMemory)), "Sessions at their memory share",
			fmt.Sprintf("your sessions hold their share of every worker's session memory that was asked (this one needs %d MiB): "+
				"end a session (DELETE /v1/sessions/{id}), or create this one with a smaller memory_mb", rec.MemoryMB))
		p.Limit = rec.MemoryMB
		return p
	}
	p := newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "No worker for the session",
		"no worker could hold the session's sandbox now ("+last+"); retry after the Retry-After delay")
	p.retryAfter = ss.cfg.RetryAfter
	return p
}

// ensureHeld brings rec back on a live worker when the process holding it
// is gone, or when it is paused.
func (ss *sessions) ensureHeld(ctx context.Context, st SessionStore, rec cache.SessionRecord) (cache.SessionRecord, *problem) {
	if p := ss.resumeIfPaused(ctx, st, rec); p != nil {
		return rec, p
	}
	held, err := ss.holds(ctx, st, rec)
	if err != nil {
		return rec, ss.problems.storeProblem(ctx, "session worker", err)
	}
	if held {
		return rec, nil
	}
	if p := ss.openSession(ctx, rec); p != nil {
		return rec, p
	}
	rec, err = st.Session(ctx, rec.ID)
	if err != nil {
		return rec, ss.problems.storeProblem(ctx, "read session", err)
	}
	return rec, nil
}

func (sr sessionRoutes) handleSessionGet(w http.ResponseWriter, r *http.Request, caller string) {
	st, p := sr.ss.sessionStore()
	if p == nil {
		var rec cache.SessionRecord
		if rec, p = sr.ss.sessionOf(r.Context(), st, caller, r.PathValue("id")); p == nil {
			v := rec.View(sr.ss.cfg.Now())
			v.Links = sessionLinks(rec.ID)
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeProblem(w, p)
}

// handleSessionList answers GET /v1/sessions: the caller's live sessions
// (at most SessionsPerTenant), oldest first, those whose metadata holds
// every ?tag=KEY=VALUE.
func (sr sessionRoutes) handleSessionList(w http.ResponseWriter, r *http.Request, caller string) {
	tags, p := parseTags(r)
	var out []job.Session
	if p == nil {
		out, p = sr.ss.listSessions(r.Context(), caller, tags)
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	for i := range out {
		out[i].Links = sessionLinks(out[i].ID)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

func (sr sessionRoutes) handleSessionDelete(w http.ResponseWriter, r *http.Request, caller string) {
	v, p := sr.ss.deleteSession(r.Context(), caller, r.PathValue("id"))
	if p != nil {
		writeProblem(w, p)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
