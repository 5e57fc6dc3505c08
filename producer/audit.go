package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/job"
)

// auditLog is the API's side of tenants' audit logs: it appends records
// through one queue, in the order requests made them (drainAudit, run by
// the Server's background group), and reads them at GET /v1/audit.
type auditLog struct {
	js       jetstream.JetStream
	store    Store
	cfg      audit.Config
	tenants  map[string]Tenant // their audit bounds (auditBound)
	runtimes *registry         // names and digests of submitted jobs' runtimes
	problems *problems
	log      *slog.Logger
	now      func() time.Time
	q        chan auditItem

	// mu guards ready: the audit stream is made sure of before the first
	// append or read (NATS may come up after the API).
	mu    sync.Mutex
	ready bool
}

func newAuditLog(cfg Config, js jetstream.JetStream, runtimes *registry, pm *problems) *auditLog {
	return &auditLog{js: js, store: cfg.Store, cfg: cfg.Audit, tenants: cfg.Tenants, runtimes: runtimes,
		problems: pm, log: cfg.Logger, now: cfg.Now, q: make(chan auditItem, auditQueueSize)}
}

func (a *auditLog) ensureAudit(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ready {
		return nil
	}
	if _, err := audit.Ensure(ctx, a.js, a.cfg); err != nil {
		return err
	}
	a.ready = true
	return nil
}

type auditKeyCtx struct{}

// withAuditKey notes in r's context which API key made the request: its
// audit.KeyID.
func withAuditKey(r *http.Request, id string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), auditKeyCtx{}, id))
}

func auditKey(ctx context.Context) string { v, _ := ctx.Value(auditKeyCtx{}).(string); return v }

// appendAudit adds rec to tenant's audit log and returns once the stream
// stored it (or could not). The request it records has happened: a failure
// is logged, not answered. It goes through the same queue as
// appendAuditLater, so one API process appends its records in the order
// its requests made them.
func (a *auditLog) appendAudit(ctx context.Context, tenant string, rec job.AuditRecord) {
	done := make(chan struct{})
	if !a.queueAudit(ctx, tenant, rec, done) {
		return
	}
	t := time.NewTimer(auditTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		a.log.ErrorContext(ctx, "append audit record: no answer from the stream", slog.String("kind", string(rec.Kind)), slog.String("job_id", rec.JobID))
	}
}

// specInputs are the SHA-256 sums of a spec's inputs.
func specInputs(spec job.Spec) map[string]string {
	in := map[string]string{}
	if spec.Stdin != "" {
		in["stdin"] = audit.SHA256([]byte(spec.Stdin))
	}
	if len(spec.Args) > 0 {
		in["args"] = audit.SHA256([]byte(strings.Join(spec.Args, "\x00")))
	}
	if len(spec.Env) > 0 {
		var kv []string
		for k, v := range spec.Env {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		in["env"] = audit.SHA256([]byte(strings.Join(kv, "\x00")))
	}
	for _, f := range spec.Files {
		b, err := f.Bytes()
		if err != nil {
			b = []byte(f.Content)
		}
		in["file:"+f.Name] = audit.SHA256(b)
	}
	if len(in) == 0 {
		return nil
	}
	return in
}

// auditSubmission records a submission's answer in the tenant's audit log:
// an accepted job as a submission (or a replay), a budget's refusal as such.
func (a *auditLog) auditSubmission(ctx context.Context, tenant string, spec job.Spec, opts submitOptions, out answer, err error) {
	rec := job.AuditRecord{Kind: job.AuditSubmission, Runtime: spec.Runtime, CodeSHA256: job.CodeSHA256(spec.Code),
		Inputs: specInputs(spec), Budget: spec.Budget, ReplayOf: opts.replayOf}
	if opts.replayOf != "" {
		rec.Kind = job.AuditReplay
	}
	if err != nil {
		var r *refusal
		if errors.As(err, &r) && r.kind == errBudgetExhausted {
			rec.Kind, rec.Detail = job.AuditBudgetRefusal, r.detail
			a.appendAudit(ctx, tenant, rec)
		}
		return
	}
	rec.JobID = out.id
	if rt, lerr := a.runtimes.lookup(ctx, cmpRuntime(spec.Runtime)); lerr == nil {
		rec.Runtime, rec.Digest = rt.Name, rt.Digest
	}
	if r, ok := out.body.(*resultView); ok && out.done && r.CacheHit {
		// No worker appends anything of a cache hit after it, so its
		// record need not be stored before the answer.
		rec.CacheHit = true
		a.appendAuditLater(ctx, tenant, rec)
		return
	}
	a.appendAudit(ctx, tenant, rec)
}

// auditItem is a record queued for drainAudit; done, when set, is closed
// once the stream answered.
type auditItem struct {
	tenant string
	rec    job.AuditRecord
	done   chan struct{}
}

const (
	// auditQueueSize bounds the records waiting to be appended; a full
	// queue makes requests wait for room, so none is dropped.
	auditQueueSize = 4096
	// auditTimeout bounds a wait for room or for the stream's answer.
	auditTimeout = 5 * time.Second
)

// appendAuditLater queues rec and returns at once: a cache hit is the
// API's fastest answer, and waiting for the stream on each halved the rate
// of hits. Nothing of a hit is appended after it by a worker, so its record
// need not be stored before the answer.
func (a *auditLog) appendAuditLater(ctx context.Context, tenant string, rec job.AuditRecord) {
	a.queueAudit(ctx, tenant, rec, nil)
}

// queueAudit puts rec in the queue, waiting for room at most auditTimeout.
func (a *auditLog) queueAudit(ctx context.Context, tenant string, rec job.AuditRecord, done chan struct{}) bool {
	rec.Key = auditKey(ctx)
	if rec.Time.IsZero() {
		rec.Time = a.now().UTC()
	}
	select {
	case a.q <- auditItem{tenant, rec, done}:
		return true // the usual case: room, no timer needed
	default:
	}
	t := time.NewTimer(auditTimeout)
	defer t.Stop()
	select {
	case a.q <- auditItem{tenant, rec, done}:
		return true
	case <-t.C:
		a.log.ErrorContext(ctx, "append audit record: the queue stayed full", slog.String("kind", string(rec.Kind)), slog.String("job_id", rec.JobID))
		return false
	}
}

// drainAudit appends queued records in order, many in flight at once,
// until ctx ends, and then what is left.
func (a *auditLog) drainAudit(ctx context.Context) {
	var batch []auditItem      // reused: appendBatch is done with it when it returns
	var recs []job.AuditRecord // appendBatch's, reused likewise
	for {
		clear(batch)
		batch = batch[:0]
		select {
		case it := <-a.q:
			batch = append(batch, it)
		case <-ctx.Done():
			for {
				select {
				case it := <-a.q:
					a.appendBatch(context.WithoutCancel(ctx), []auditItem{it}, nil)
				default:
					return
				}
			}
		}
	more:
		for len(batch) < 256 {
			select {
			case it := <-a.q:
				batch = append(batch, it)
			default:
				break more
			}
		}
		recs = a.appendBatch(context.WithoutCancel(ctx), batch, recs)
	}
}

// appendBatch publishes batch as few messages as it can, every one in
// flight at once, waits for the stream to store each, and tells the items'
// waiters (each once the message holding its record is stored). recs is
// room for the records of a group, returned (cleared) for the next batch.
func (a *auditLog) appendBatch(ctx context.Context, batch []auditItem, recs []job.AuditRecord) []job.AuditRecord {
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	defer func() {
		for _, it := range batch {
			if it.done != nil {
				close(it.done)
			}
		}
	}()
	fail := func(it auditItem, err error) {
		a.log.ErrorContext(ctx, "append audit record", slog.String("kind", string(it.rec.Kind)), slog.String("job_id", it.rec.JobID), slog.Any("error", err))
	}
	if err := a.ensureAudit(ctx); err != nil {
		for _, it := range batch {
			fail(it, err)
		}
		return recs
	}
	groups := groupAudit(batch)
	futures := make([][]jetstream.PubAckFuture, len(groups))
	now := a.now()
	for i, g := range groups {
		recs = recs[:0]
		for _, k := range g.items {
			recs = append(recs, batch[k].rec)
		}
		// The tenant's audit bounds: what is past them is not appended;
		// the day's first refusal is itself a record.
		kept, reached := audit.Admit(ctx, a.store, a.log, g.tenant, a.auditBound(g.tenant), recs, now)
		if reached != nil {
			a.log.WarnContext(ctx, "a tenant's audit log reached its bound for the day", slog.String("tenant", g.tenant), slog.String("detail", reached.Detail))
			if m, err := audit.Msg(g.tenant, *reached, "audit-bound:"+job.TenantToken(g.tenant)+":"+now.UTC().Format("20060102")); err == nil {
				if f, err := a.js.PublishMsgAsync(m); err == nil {
					futures[i] = append(futures[i], f)
				}
			}
		}
		recs = recs[:kept]
		if kept == 0 {
			continue
		}
		msgs, err := audit.BatchMsgs(g.tenant, g.kind, recs)
		for _, m := range msgs {
			if err != nil {
				break
			}
			var f jetstream.PubAckFuture
			if f, err = a.js.PublishMsgAsync(m); err == nil {
				futures[i] = append(futures[i], f)
			}
		}
		if err != nil {
			for _, k := range g.items {
				fail(batch[k], err)
			}
		}
	}
	clear(recs)
	for i, fs := range futures {
		for _, f := range fs {
			var err error
			select {
			case <-f.Ok():
			case err = <-f.Err():
			case <-ctx.Done():
				err = fmt.Errorf("no answer from the stream: %w", ctx.Err())
			}
			if err != nil {
				for _, k := range groups[i].items {
					fail(batch[k], err)
				}
				break
			}
		}
	}
	return recs[:0]
}

// auditBound is tenant's audit bounds (its key-file settings, defaults
// applied).
func (a *auditLog) auditBound(tenant string) audit.Bound {
	b := a.tenants[tenant].Bounds.withDefaults()
	return audit.Bound{RecordsPerDay: b.AuditRecordsPerDay, BytesPerDay: b.AuditBytesPerDay}
}

// auditGroup is records of one tenant and kind that go in one message:
// items are their places in the drain's batch.
type auditGroup struct {
	tenant string
	kind   job.AuditKind
	items  []int
}

// groupAudit puts batch's records in groups of one tenant and kind,
// published in the order of their first records, and keeps the order of
// records that may follow from one another. A record whose request is
// still waiting for it (done set) was made concurrently with every record
// after it in the batch, so those may be stored before it; a record
// queued without waiting (a cache hit, already answered) may have caused
// the records queued after it, so none of them joins a group published
// before its own.
func groupAudit(batch []auditItem) []auditGroup {
	var groups []auditGroup
	type key struct {
		tenant string
		kind   job.AuditKind
	}
	var open map[key]int // the last group of each tenant and kind, once there are two
	barrier := 0         // groups before it take no more records
	for i, it := range batch {
		k := key{it.tenant, it.rec.Kind}
		g, ok := len(groups)-1, false
		switch {
		case open != nil:
			g, ok = open[k]
		case g >= 0:
			// Most drains hold one tenant's cache hits: one group, no map.
			ok = groups[g].tenant == k.tenant && groups[g].kind == k.kind
			if !ok {
				open = map[key]int{{groups[g].tenant, groups[g].kind}: g}
			}
		}
		if !ok || g < barrier {
			g = len(groups)
			groups = append(groups, auditGroup{tenant: it.tenant, kind: it.rec.Kind, items: make([]int, 0, len(batch)-i)})
			if open != nil {
				open[k] = g
			}
		}
		groups[g].items = append(groups[g].items, i)
		if it.done == nil {
			barrier = g
		}
	}
	return groups
}

func cmpRuntime(name string) string {
	if name == "" {
		return job.DefaultRuntime
	}
	return name
}

// handleAudit answers GET /v1/audit?since=&kind=&limit=: the caller's audit
// records in the order they were made.
func (a *auditLog) handleAudit(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeProblem(w, badParam("since", fmt.Sprintf("since %q is not an RFC 3339 time such as 2026-11-24T20:00:00Z", v)))
			return
		}
		since = t
	}
	kind := job.AuditKind(q.Get("kind"))
	if kind != "" && !slices.Contains(job.AuditKinds(), kind) {
		writeProblem(w, badParam("kind", fmt.Sprintf("kind %q is not one of %v", kind, job.AuditKinds())))
		return
	}
	limit := audit.MaxReadDefault
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > audit.MaxReadDefault {
			writeProblem(w, badParam("limit", fmt.Sprintf("limit %q must be a whole number from 1 to %d", v, audit.MaxReadDefault)))
			return
		}
		limit = n
	}
	if err := a.ensureAudit(ctx); err != nil {
		writeProblem(w, a.problems.storeProblem(ctx, "read audit log", fmt.Errorf("%w", err)))
		return
	}
	recs, err := audit.Read(ctx, a.js, caller, kind, since, limit)
	if err != nil {
		writeProblem(w, a.problems.storeProblem(ctx, "read audit log", err))
		return
	}
	if recs == nil {
		recs = []job.AuditRecord{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
}
