package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Sessions on a worker. Routing: the API asks for a session's box on
// job.SessionOpenPrefix+runtime, a queue group, so one worker with room
// takes it; that worker claims the session in the catalog (Redis,
// cache/sessions.go), which fences every later change by the worker
// process and incarnation holding it. Calls are accepted into the catalog
// by the API, in order, and the API tells the holder on its own subject
// (job.SessionWorkerPrefix+worker id); the holder's loop takes the calls
// one at a time (a call is marked running before it runs, so a call is
// never run twice: one found running by a later holder is reported as
// interrupted), records each result, checkpoints /work to the object store
// and announces the end on job.SessionDonePrefix+session id. A lost worker
// is noticed by the API (its lease is gone), which asks for the session
// again: another worker claims the next incarnation and brings back its
// files (and, with restore "replay", its successful calls).

// Defaults of SessionConfig.
const (
	SessionsMaxDefault = 64
	// SessionsMemoryDefault is the default of SessionConfig.MemoryBytes.
	SessionsMemoryDefault = 4 << 30
	// sessionMemoryFloor is what a session is counted as declaring when
	// its request does not say (an API of an earlier version).
	sessionMemoryFloor  = 64 << 20
	SessionPollDefault  = time.Second
	SessionFilesMaxSize = 256 << 20
)

// SessionConfig configures the sessions a worker holds.
type SessionConfig struct {
	// Off: the worker takes no session.
	Off bool
	// Max bounds the sessions this worker holds at once. Default:
	// SessionsMaxDefault (64).
	Max int
	// MemoryBytes bounds the memory this worker's sessions may use
	// together: the sum of their caps (each session's memory_mb, which its
	// box's cgroup enforces), counted from the moment a session is taken,
	// not by what its boxes hold now. A session that would not fit is not
	// taken here (the API tries another worker). Default:
	// SessionsMemoryDefault (4 GiB).
	MemoryBytes int64
	// TenantMemoryBytes bounds what one tenant's sessions may declare on
	// this worker, so that one tenant cannot take the memory other
	// tenants' sessions need. Default: half of MemoryBytes.
	TenantMemoryBytes int64
	// Poll is how often a session's loop reads the catalog without being
	// told (a lost notice, the idle and lifetime deadlines). Default:
	// SessionPollDefault (1 s).
	Poll time.Duration
	// Now is the clock deadlines are read against. Default: the worker's
	// Clock (Config.Clock).
	Now func() time.Time
}

func (c SessionConfig) withDefaults() SessionConfig {
	c.Max = cmp.Or(c.Max, SessionsMaxDefault)
	c.MemoryBytes = cmp.Or(c.MemoryBytes, SessionsMemoryDefault)
	c.TenantMemoryBytes = cmp.Or(c.TenantMemoryBytes, c.MemoryBytes/2)
	c.Poll = cmp.Or(c.Poll, SessionPollDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// SessionStore is the part of cache.Store sessions use.
type SessionStore interface {
	Session(ctx context.Context, id string) (cache.SessionRecord, error)
	ClaimSession(ctx context.Context, id, worker, instance string, expect int) (int, error)
	ReadySession(ctx context.Context, id string, h cache.SessionHolder, img job.Image, idleUntil time.Time, fresh bool, note, restored string) error
	PauseHeld(ctx context.Context, tenant, id string, h cache.SessionHolder, now time.Time) error
	SetSessionFiles(ctx context.Context, id string, h cache.SessionHolder, files []job.SessionFileEntry) error
	NextCall(ctx context.Context, id string, h cache.SessionHolder, now time.Time) (int, int64, []byte, error)
	FinishCall(ctx context.Context, id string, h cache.SessionHolder, seq int64, res job.CallResult, idleUntil time.Time, files []job.SessionFileEntry, fresh bool, note string) error
	BumpIncarnation(ctx context.Context, id string, h cache.SessionHolder) (int, error)
	SessionCall(ctx context.Context, id string, seq int64) (cache.SessionCallRecord, error)
	EndSession(ctx context.Context, id, tenant, reason string) (bool, error)
}

// sessionHost holds a worker's sessions.
type sessionHost struct {
	w     *Worker
	cfg   SessionConfig
	store SessionStore

	mu      sync.Mutex
	live    map[string]*liveSession
	opening map[string]sessionClaim // sessions being opened, by id
	stopped bool                    // startSessions' stop has begun
	wg      sync.WaitGroup
	ctx     context.Context // the sessions' life: ends when the worker stops
}

// sessionClaim is what a session counts against a worker's room: its
// tenant and the memory it may use.
type sessionClaim struct {
	tenant string
	bytes  int64
}

// claimOf is what rec counts against a worker's room.
func claimOf(tenant string, memoryMB int64) sessionClaim {
	return sessionClaim{tenant: tenant, bytes: max(memoryMB<<20, sessionMemoryFloor)}
}

// liveSession is a session this worker holds.
type liveSession struct {
	rec    cache.SessionRecord
	holder cache.SessionHolder
	box    sandboxapi.Session
	nudge  chan struct{}
	files  map[string]job.SessionFileEntry // the last checkpoint
	// fresh: the next call finds a fresh interpreter (note says why).
	fresh bool
	note  string
	// restarted: the interpreter ended in the last call; the next call
	// starts the next incarnation.
	restarted bool
	// restored: what this incarnation brought back of a paused session
	// ("" when it was not resumed from a pause).
	restored string
	// callAudit is the running call's audit records (its egress), flushed
	// with its result's by finish. Calls run one at a time.
	callAudit *runAudit
}

// takesSessions reports whether this worker holds sessions: its backend
// hosts them, its store keeps their catalog, and they are not turned off.
func (w *Worker) takesSessions() bool {
	_, ok := w.cfg.Store.(SessionStore)
	return ok && w.cfg.Runtime.HostsSessions() && !w.cfg.Sessions.Off
}

// startSessions subscribes to session requests when the runtime hosts
// sessions; the returned func stops them and removes every session box.
func (w *Worker) startSessions(ctx context.Context) (func(), error) {
	if !w.takesSessions() {
		return func() {}, nil
	}
	store := w.cfg.Store.(SessionStore)
	cfg := w.cfg.Sessions
	if cfg.Now == nil {
		cfg.Now = w.cfg.Clock.Now
	}
	cfg = cfg.withDefaults()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h := &sessionHost{w: w, cfg: cfg, store: store, live: map[string]*liveSession{}, opening: map[string]sessionClaim{}, ctx: sctx}
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		h.mu.Lock()
		h.stopped = true // no session starts from now on
		h.mu.Unlock()
		cancel()
		h.wg.Wait()
	}
	for _, rt := range w.cfg.Runtime.Runtimes() {
		sub, err := w.cfg.NATS.QueueSubscribe(job.SessionOpenPrefix+rt, job.SessionOpenQueue, h.onOpen)
		if err != nil {
			stop()
			return nil, fmt.Errorf("worker: subscribe %s: %w", job.SessionOpenPrefix+rt, err)
		}
		subs = append(subs, sub)
	}
	sub, err := w.cfg.NATS.Subscribe(job.SessionWorkerPrefix+w.cfg.ID, h.onNudge)
	if err != nil {
		stop()
		return nil, fmt.Errorf("worker: subscribe %s: %w", job.SessionWorkerPrefix+w.cfg.ID, err)
	}
	subs = append(subs, sub)
	return stop, nil
}

// onNudge wakes the loop of the session the message names. Sent as a
// request, it answers whether this process holds the session
// (job.SessionHeld): the API asks before it takes a session whose worker's
// lease lapsed elsewhere, since a store outage lapses the leases of workers
// that are alive.
func (h *sessionHost) onNudge(msg *nats.Msg) {
	id := string(msg.Data)
	h.mu.Lock()
	ls := h.live[id]
	_, opening := h.opening[id]
	h.mu.Unlock()
	if msg.Reply != "" {
		answer := ""
		if ls != nil || opening {
			answer = job.SessionHeld
		}
		_ = msg.Respond([]byte(answer))
	}
	if ls != nil {
		select {
		case ls.nudge <- struct{}{}:
		default:
		}
	}
}

// declared is what the sessions held or being opened here may use, all of
// them and tenant's. Called with h.mu held.
func (h *sessionHost) declared(tenant string) (all, tenants int64) {
	add := func(c sessionClaim) {
		all += c.bytes
		if c.tenant == tenant {
			tenants += c.bytes
		}
	}
	for _, c := range h.opening {
		add(c)
	}
	for _, ls := range h.live {
		add(claimOf(ls.rec.Tenant, ls.rec.MemoryMB))
	}
	return all, tenants
}

// room reports whether session c fits here: under Max, within MemoryBytes
// and its tenant's share of it, not stopping; tenantFull when only the
// tenant's share stands in the way. Called with h.mu held.
func (h *sessionHost) room(c sessionClaim) (ok, tenantFull bool) {
	if h.stopped || len(h.live)+len(h.opening) >= h.cfg.Max {
		return false, false
	}
	all, tenants := h.declared(c.tenant)
	if all+c.bytes > h.cfg.MemoryBytes {
		return false, false
	}
	if c.tenant != "" && tenants+c.bytes > h.cfg.TenantMemoryBytes {
		return false, true
	}
	return true, false
}

// onOpen makes (or brings back) a session's box when there is room.
func (h *sessionHost) onOpen(msg *nats.Msg) {
	var req job.SessionOpen
	if err := json.Unmarshal(msg.Data, &req); err != nil || req.ID == "" {
		h.reply(msg, job.SessionOpened{Error: "a session open request without a session id", Invalid: true})
		return
	}
	c := claimOf(req.Tenant, req.MemoryMB)
	h.mu.Lock()
	ok, tenantFull := h.room(c)
	_, held := h.live[req.ID]
	_, opening := h.opening[req.ID]
	held = held || opening
	if !held && ok {
		h.wg.Add(1)
		h.opening[req.ID] = c
	}
	h.mu.Unlock()
	switch {
	case held:
		h.reply(msg, job.SessionOpened{Worker: h.w.cfg.ID})
		return
	case tenantFull:
		h.reply(msg, job.SessionOpened{Error: "the tenant's sessions hold their share of worker " + h.w.cfg.ID + "'s session memory", TenantFull: true})
		return
	case !ok:
		h.reply(msg, job.SessionOpened{Error: "no room for a session on worker " + h.w.cfg.ID})
		return
	}
	go func() {
		defer h.wg.Done()
		ls, err := h.open(h.ctx, req.ID)
		h.mu.Lock()
		delete(h.opening, req.ID)
		h.mu.Unlock()
		if err != nil {
			var ie *job.InvalidError
			h.reply(msg, job.SessionOpened{Error: err.Error(), Invalid: errors.As(err, &ie)})
			return
		}
		h.reply(msg, job.SessionOpened{Worker: h.w.cfg.ID})
		h.loop(h.ctx, ls)
	}()
}

func (h *sessionHost) reply(msg *nats.Msg, v job.SessionOpened) {
	b, _ := json.Marshal(v)
	_ = msg.Respond(b)
}

// open claims the session's next incarnation, makes its box and brings
// back its files (and its calls, with restore "replay").
func (h *sessionHost) open(ctx context.Context, id string) (*liveSession, error) {
	rec, err := h.store.Session(ctx, id)
	if err != nil {
		return nil, err
	}
	inc, err := h.store.ClaimSession(ctx, id, h.w.cfg.ID, h.w.owner.instance, rec.Inc)
	if err != nil {
		return nil, err
	}
	holder := cache.SessionHolder{Worker: h.w.cfg.ID, Instance: h.w.owner.instance, Inc: inc}
	box, err := h.w.cfg.Runtime.OpenSession(ctx, sandboxapi.SessionOptions{ID: id, Tenant: rec.Tenant, Runtime: rec.Runtime, MemoryMB: rec.MemoryMB, Restore: rec.Inc > 0})
	if err != nil {
		if rec.Inc == 0 {
			_, _ = h.store.EndSession(context.WithoutCancel(ctx), id, rec.Tenant, job.SessionEndUnavailable)
		}
		return nil, fmt.Errorf("session %s: %w", id, err)
	}
	ls := &liveSession{rec: rec, holder: holder, box: box, nudge: make(chan struct{}, 1), files: map[string]job.SessionFileEntry{}}
	if err := h.restore(ctx, ls); err != nil {
		box.Close(ctx)
		return nil, err
	}
	now := h.cfg.Now()
	if err := h.store.ReadySession(ctx, id, holder, box.Image(), now.Add(rec.IdleTimeout), ls.fresh, ls.note, ls.restored); err != nil {
		box.Close(ctx)
		return nil, err
	}
	h.mu.Lock()
	delete(h.opening, id)
	h.live[id] = ls
	h.mu.Unlock()
	h.w.log.InfoContext(ctx, "session opened", slog.String("session_id", id), slog.Int("incarnation", inc), slog.String("container_id", box.ContainerID()))
	return ls, nil
}

// loop serves a held session until it ends, another holder takes it, or
// the worker stops; then removes its box.
func (h *sessionHost) loop(ctx context.Context, ls *liveSession) {
	id := ls.rec.ID
	defer func() {
		h.mu.Lock()
		delete(h.live, id)
		h.mu.Unlock()
		ls.box.Close(context.WithoutCancel(ctx))
		h.w.log.InfoContext(ctx, "session box removed", slog.String("session_id", id))
	}()
	poll := time.NewTicker(h.cfg.Poll)
	defer poll.Stop()
	for {
		rec, err := h.store.Session(ctx, id)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, cache.ErrNotFound):
			return
		case err != nil:
			h.w.log.WarnContext(ctx, "session: read the catalog", slog.String("session_id", id), slog.Any("error", err))
		case rec.Instance != h.w.owner.instance || rec.Worker != h.w.cfg.ID || rec.Inc != ls.holder.Inc:
			return // another holder took it
		default:
			if why := rec.Expired(h.cfg.Now()); why != "" {
				if _, err := h.store.EndSession(ctx, id, rec.Tenant, why); err != nil {
					h.w.log.WarnContext(ctx, "session: end", slog.String("session_id", id), slog.Any("error", err))
				}
				return
			}
			if !h.drain(ctx, ls) {
				return
			}
			// Asked to pause, or idle past its idle timeout: the calls
			// accepted before are served first.
			if rec, err := h.store.Session(ctx, id); err == nil && (rec.PauseAsked || rec.Idle(h.cfg.Now())) && h.pause(ctx, ls) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ls.nudge:
		case <-poll.C:
		}
	}
}

// drain runs every call waiting, in order. It returns false when the
// session is no longer this worker's to serve.
func (h *sessionHost) drain(ctx context.Context, ls *liveSession) bool {
	for ctx.Err() == nil {
		state, seq, raw, err := h.store.NextCall(ctx, ls.rec.ID, ls.holder, h.cfg.Now())
		if errors.Is(err, cache.ErrSessionFenced) || errors.Is(err, cache.ErrSessionEnded) {
			return false
		}
		if err != nil {
			h.w.log.WarnContext(ctx, "session: next call", slog.String("session_id", ls.rec.ID), slog.Any("error", err))
			return true
		}
		switch state {
		case 0:
			return true
		case cache.CallInterrupted, cache.CallWithdrawn:
			// Answered without running: one the lost holder had started
			// (never run twice), or one withdrawn before it started (the
			// interpreter untouched).
			res := job.CallResult{Seq: seq, Incarnation: ls.holder.Inc, Result: job.Result{ID: ls.rec.ID + "-" + strconv.FormatInt(seq, 10),
				Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal,
					"this call was running when the session's worker was lost; it was not run again, and what it did before is unknown")}}
			if state == cache.CallWithdrawn {
				res.StateRestored, res.Status = true, job.StatusCanceled
				res.Error = job.NewFailure(job.CategoryCanceled, "this call was withdrawn before it ran (canceled while it waited behind the session's earlier calls); it did not run")
			}
			if !h.finish(ctx, ls, seq, res, nil) {
				return false
			}
		case cache.CallRun:
			var call job.SessionCall
			if err := json.Unmarshal(raw, &call); err != nil {
				h.w.log.ErrorContext(ctx, "session: a call's spec", slog.String("session_id", ls.rec.ID), slog.Any("error", err))
				return true
			}
			res, files, ok := h.runCall(ctx, ls, seq, call)
			if !ok {
				return false
			}
			if !h.finish(ctx, ls, seq, res, files) {
				return false
			}
		}
	}
	return false
}

// runCall is run under a recover: a panic while a call is handled fails
// that call alone (internal_error, as a job's), and the session and every
// other run on the worker go on.
func (h *sessionHost) runCall(ctx context.Context, ls *liveSession, seq int64, call job.SessionCall) (cr job.CallResult, files []job.SessionFileEntry, ok bool) {
	defer func() {
		if p := recover(); p != nil {
			h.w.log.ErrorContext(ctx, "panic while running a session's call", slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			id := call.EventsID
			if !job.ValidID(id) {
				id = job.NewID()
			}
			cr = job.CallResult{Seq: seq, Incarnation: ls.holder.Inc, StateRestored: true,
				Result: job.Result{ID: id, Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, errPanicked.Error())}}
			files, ok = nil, true
		}
	}()
	if call.File != nil {
		return h.runFileOp(ctx, ls, seq, call) // session_files.go
	}
	return h.run(ctx, ls, seq, call)
}

// run runs one call in the session's box and checkpoints its files.
func (h *sessionHost) run(ctx context.Context, ls *liveSession, seq int64, call job.SessionCall) (job.CallResult, []job.SessionFileEntry, bool) {
	id := call.EventsID
	if !job.ValidID(id) {
		id = job.NewID()
	}
	cr := job.CallResult{Seq: seq, StateRestored: true}
	if ls.restarted {
		var inc int
		// A store outage delays the call; it does not end the session.
		err := h.w.storeWatch.retry(ctx, h.w.log, func(ctx context.Context) (err error) {
			inc, err = h.store.BumpIncarnation(ctx, ls.rec.ID, ls.holder)
			return err
		})
		if err != nil {
			return cr, nil, false
		}
		ls.holder.Inc, ls.restarted = inc, false
	}
	if ls.fresh {
		cr.StateRestored, cr.SessionNote = false, ls.note
		ls.fresh, ls.note = false, ""
	} else if ls.note != "" {
		cr.SessionNote, ls.note = ls.note, ""
	}
	cr.Incarnation = ls.holder.Inc
	if !ls.box.Alive() {
		// The box ended (an anomaly): a new one, with the checkpoint's files.
		if err := h.rebox(ctx, ls); err != nil {
			cr.Result = job.Result{ID: id, Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "the session's sandbox could not be made again: "+err.Error())}
			return cr, nil, true
		}
		cr.StateRestored, cr.SessionNote, cr.Incarnation = false, ls.note, ls.holder.Inc
		ls.note = ""
	}
	started := h.cfg.Now()
	if call.Command != nil {
		// A command: code of the launcher's commands module (session_commands.go).
		code, err := commandCode(seq, call.Command)
		if err != nil {
			cr.Result = job.Result{ID: id, Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, err.Error())}
			return cr, nil, true
		}
		call.Code = code
	}
	spec := call.Spec(ls.rec.Runtime, ls.rec.Limits)
	spec.Network = ls.rec.Network
	// The call's run continues the trace of the API's session.call span.
	ctx, span := h.w.tracer.Start(ktrace.ExtractMap(ctx, h.w.cfg.Propagator, call.Trace), ktrace.SpanExecute,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(started), trace.WithAttributes(append([]attribute.KeyValue{
			ktrace.SessionIDKey.String(ls.rec.ID), ktrace.CallSeqKey.Int64(seq), ktrace.RuntimeKey.String(ls.rec.Runtime),
			ktrace.WorkerIDKey.String(h.w.cfg.ID), ktrace.HostNameKey.String(h.w.host), ktrace.CodeSHA256Key.String(job.CodeSHA256(spec.Code)),
		}, ktrace.LimitAttrs(spec.Limits)...)...))
	defer span.End()
	// What leaves the worker is redacted by the tenant's policy, live
	// output (the call's events) and the result alike.
	log := h.w.log.With(slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq))
	red := detector(ctx, log, call.Redact)
	ls.callAudit = h.w.audit.newRun(log, id, ls.rec.Tenant, call.Quota, red)
	output := events.NewRedactedOutput(h.w.cfg.NATS, id, spec.Limits.OutputBytes, red, func(err error) {
		log.DebugContext(ctx, "publish a session call's output event", slog.Any("error", err))
	})
	defer output.Close()
	req := sandboxapi.Request{ID: id, Spec: spec, Tenant: ls.rec.Tenant, Output: output.Write}
	if !spec.Network.Empty() {
		// The call's own proxy on the session's listener: the call's
		// connections are in its result, on its span and in the tenant's
		// audit log under the call's id.
		req.Network = h.w.egress.network(ctx, h.w.log.With(slog.String("session_id", ls.rec.ID), slog.String("call_id", id)),
			job.Message{ID: id, Spec: spec, Tenant: ls.rec.Tenant}, ls.callAudit)
	}
	_ = events.Status(h.w.cfg.NATS, id, job.StatusRunning, h.w.cfg.ID)
	// A cancel by request (kiln.cancel naming the call) interrupts the
	// call as its timeout would: canceled, the interpreter kept.
	callCtx, cancel := context.WithCancelCause(ctx)
	// A cancel sent after the call started in the store but before it got
	// here: the call does not run (the interpreter is left as it was).
	early := h.w.cancels.startCall(id, cancel)
	var res job.Result
	var info sandboxapi.CallInfo
	var err error
	if early {
		res = job.Result{ID: id, Status: job.StatusCanceled, Error: job.NewFailure(job.CategoryCanceled, "canceled before it ran")}
	} else {
		res, info, err = ls.box.Exec(callCtx, req)
	}
	h.w.cancels.endCall(id)
	cancel(nil)
	output.Close()
	red.Result(&res)
	if err != nil && !errors.Is(err, sandboxapi.ErrSessionGone) && res.Status == "" {
		res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, err.Error())
	}
	if errors.Is(err, sandboxapi.ErrSessionGone) {
		res.Status, res.Error = job.StatusInternalError, job.NewFailure(job.CategoryInternal, "the session's sandbox ended before the call ran; call again")
		info.Ended = true
	}
	finished := h.cfg.Now()
	res.Worker, res.StartedAt, res.FinishedAt = h.w.cfg.ID, &started, &finished
	res.TraceID = span.SpanContext().TraceID().String()
	traceOutcome(span, res)
	if call.Command != nil {
		// A list's command lines come in a display output, redacted with
		// the rest of the result above (each string of a JSON value).
		cr.Command, cr.Commands = commandState(call.Command, &res)
	}
	cr.Result = res
	if info.Ended {
		ls.restarted, ls.fresh = true, true
		ls.note = fmt.Sprintf("the session's interpreter ended in call %d (%s): its variables and imports are gone; "+
			"files in /work are kept. Run again what the next steps need.", seq, res.Status)
	}
	if res.CPUMS > 0 {
		if st, ok := h.w.cfg.Store.(interface {
			SettleCPU(ctx context.Context, tenant, id string, cpu time.Duration, at time.Time) error
		}); ok {
			if err := st.SettleCPU(ctx, ls.rec.Tenant, id, time.Duration(res.CPUMS)*time.Millisecond, finished); err != nil {
				h.w.log.WarnContext(ctx, "session: charge the call's CPU time", slog.String("session_id", ls.rec.ID), slog.Any("error", err))
			}
		}
	}
	if call.Budget != "" && call.BudgetHold != "" {
		// The call's reservation, made by the API as it accepted the call.
		h.w.results.settleBudget(ctx, h.w.log.With(slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq)),
			job.Message{ID: call.BudgetHold, Spec: job.Spec{Budget: call.Budget}, Tenant: ls.rec.Tenant}, res, true)
	}
	files, err := h.checkpoint(ctx, ls)
	if err != nil {
		h.w.log.WarnContext(ctx, "session: checkpoint", slog.String("session_id", ls.rec.ID), slog.Any("error", err))
		files = nil
	}
	return cr, files, true
}

// pause frees the session's sandbox and keeps its files: a checkpoint of
// /work, then the session recorded paused (out of its tenant's live
// sessions), then the loop ends and removes the box. It reports whether the
// session paused; on a store outage it waits, keeping the session.
func (h *sessionHost) pause(ctx context.Context, ls *liveSession) bool {
	log := h.w.log.With(slog.String("session_id", ls.rec.ID))
	// Its variables are kept in /work for the checkpoint (session_variables.go);
	// a session that stays up does not keep the file.
	h.saveVariables(ctx, ls, log)
	files, err := h.checkpoint(ctx, ls)
	if ls.box.Alive() {
		_ = ls.box.Remove(job.SessionVariablesFile, false)
	}
	if err != nil {
		// A session whose files cannot be kept is not paused: it would
		// come back without them.
		log.WarnContext(ctx, "session: checkpoint before pausing; staying up", slog.Any("error", err))
		return false
	}
	if files != nil {
		// The pause's checkpoint is recorded as a call's would be.
		err := h.w.storeWatch.retry(ctx, log, func(ctx context.Context) error {
			return h.store.SetSessionFiles(ctx, ls.rec.ID, ls.holder, files)
		})
		if err != nil {
			return errors.Is(err, cache.ErrSessionFenced) || errors.Is(err, cache.ErrSessionEnded)
		}
	}
	err = h.w.storeWatch.retry(ctx, log, func(ctx context.Context) error {
		return h.store.PauseHeld(ctx, ls.rec.Tenant, ls.rec.ID, ls.holder, h.cfg.Now())
	})
	if err != nil && !errors.Is(err, cache.ErrSessionFenced) && !errors.Is(err, cache.ErrSessionEnded) {
		return false
	}
	if err == nil {
		log.InfoContext(ctx, "session paused")
		_ = h.w.cfg.NATS.Publish(job.SessionDonePrefix+ls.rec.ID, []byte(job.SessionPaused))
	}
	return true
}

// finish records a call's result and announces it. While the store does
// not answer, the worker keeps the result (and the session's interpreter)
// and records it when the store is back: an outage delays the answer, it
// loses neither the call nor the interpreter.
func (h *sessionHost) finish(ctx context.Context, ls *liveSession, seq int64, res job.CallResult, files []job.SessionFileEntry) bool {
	err := h.w.storeWatch.retry(ctx, h.w.log.With(slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq)), func(ctx context.Context) error {
		return h.store.FinishCall(ctx, ls.rec.ID, ls.holder, seq, res, h.cfg.Now().Add(ls.rec.IdleTimeout), files, ls.fresh, ls.note)
	})
	if errors.Is(err, cache.ErrSessionFenced) || errors.Is(err, cache.ErrSessionEnded) {
		return false
	}
	if err != nil {
		h.w.log.ErrorContext(ctx, "session: record a call's result", slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq), slog.Any("error", err))
		return false
	}
	a := ls.callAudit
	ls.callAudit = nil
	if a == nil {
		a = h.w.audit.newRun(h.w.log, res.ID, ls.rec.Tenant, nil, nil)
	}
	a.add(sessionResultRecord(ls.rec.ID, ls.rec.Runtime, seq, res.Result), sessionResultMsgID(ls.rec.ID, seq))
	if err := a.flush(ctx); err != nil {
		h.w.log.ErrorContext(ctx, "session: the call's audit records were not stored before the worker stopped", slog.String("session_id", ls.rec.ID), slog.Int64("seq", seq), slog.Any("error", err))
	}
	if job.ValidID(res.ID) {
		_ = events.End(h.w.cfg.NATS, res.ID, res.Result) // the call's event stream: its end
	}
	_ = h.w.cfg.NATS.Publish(job.SessionDonePrefix+ls.rec.ID, []byte(strconv.FormatInt(seq, 10)))
	return true
}

// rebox replaces a session's box that ended with a new one on this
// worker, its files brought back from the checkpoint.
func (h *sessionHost) rebox(ctx context.Context, ls *liveSession) error {
	ls.box.Close(ctx)
	inc, err := h.store.BumpIncarnation(ctx, ls.rec.ID, ls.holder)
	if err != nil {
		return err
	}
	ls.holder.Inc = inc
	box, err := h.w.cfg.Runtime.OpenSession(ctx, sandboxapi.SessionOptions{ID: ls.rec.ID, Tenant: ls.rec.Tenant, Runtime: ls.rec.Runtime, MemoryMB: ls.rec.MemoryMB})
	if err != nil {
		return err
	}
	h.mu.Lock() // memoryInUse reads it from other goroutines
	ls.box = box
	h.mu.Unlock()
	if err := h.putFiles(ctx, ls, ls.filesList()); err != nil {
		return err
	}
	ls.note = "the session's sandbox ended and was made again: its variables and imports are gone; files in /work were restored from the last checkpoint"
	return nil
}
