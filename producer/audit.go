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

// auditState makes sure the audit stream exists before the first append
// or read (NATS may come up after the API).
type auditState struct {
	mu    sync.Mutex
	ready bool
}

func (s *Server) ensureAudit(ctx context.Context) error {
	st := &s.audit
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ready {
		return nil
	}
	if _, err := audit.Ensure(ctx, s.js, s.cfg.Audit); err != nil {
		return err
	}
	st.ready = true
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
func (s *Server) appendAudit(ctx context.Context, tenant string, rec job.AuditRecord) {
	done := make(chan struct{})
	if !s.queueAudit(ctx, tenant, rec, done) {
		return
	}
	t := time.NewTimer(auditTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.ErrorContext(ctx, "append audit record: no answer from the stream", slog.String("kind", string(rec.Kind)), slog.String("job_id", rec.JobID))
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
func (s *Server) auditSubmission(ctx context.Context, tenant string, spec job.Spec, opts submitOptions, out answer, err error) {
	rec := job.AuditRecord{Kind: job.AuditSubmission, Runtime: spec.Runtime, CodeSHA256: job.CodeSHA256(spec.Code),
		Inputs: specInputs(spec), Budget: spec.Budget, ReplayOf: opts.replayOf}
	if opts.replayOf != "" {
		rec.Kind = job.AuditReplay
	}
	if err != nil {
		var r *refusal
		if errors.As(err, &r) && r.kind == errBudgetExhausted {
			rec.Kind, rec.Detail = job.AuditBudgetRefusal, r.detail
			s.appendAudit(ctx, tenant, rec)
		}
		return
	}
	rec.JobID = out.id
	if rt, lerr := s.runtimes.lookup(ctx, cmpRuntime(spec.Runtime)); lerr == nil {
		rec.Runtime, rec.Digest = rt.Name, rt.Digest
	}
	if r, ok := out.body.(*resultView); ok && out.done && r.CacheHit {
		// No worker appends anything of a cache hit after it, so its
		// record need not be stored before the answer.
		rec.CacheHit = true
		s.appendAuditLater(ctx, tenant, rec)
		return
	}
	s.appendAudit(ctx, tenant, rec)
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
func (s *Server) appendAuditLater(ctx context.Context, tenant string, rec job.AuditRecord) {
	s.queueAudit(ctx, tenant, rec, nil)
}

// queueAudit puts rec in the queue, waiting for room at most auditTimeout.
func (s *Server) queueAudit(ctx context.Context, tenant string, rec job.AuditRecord, done chan struct{}) bool {
	rec.Key = auditKey(ctx)
	if rec.Time.IsZero() {
		rec.Time = s.cfg.Now().UTC()
	}
	select {
	case s.auditQ <- auditItem{tenant, rec, done}:
		return true // the usual case: room, no timer needed
	default:
	}
	t := time.NewTimer(auditTimeout)
	defer t.Stop()
	select {
	case s.auditQ <- auditItem{tenant, rec, done}:
		return true
	case <-t.C:
		s.log.ErrorContext(ctx, "append audit record: the queue stayed full", slog.String("kind", string(rec.Kind)), slog.String("job_id", rec.JobID))
		return false
	}
}

// drainAudit appends queued records in order, many in flight at once,
// until ctx ends, and then what is left.
func (s *Server) drainAudit(ctx context.Context) {
	var batch []auditItem      // reused: appendBatch is done with it when it returns
	var recs []job.AuditRecord // appendBatch's, reused likewise
	for {
		clear(batch)
		batch = batch[:0]
		select {
		case it := <-s.auditQ:
			batch = append(batch, it)
		case <-ctx.Done():
			for {
				select {
				case it := <-s.auditQ:
					s.appendBatch(context.WithoutCancel(ctx), []auditItem{it}, nil)
				default:
					return
				}
			}
		}
	more:
		for len(batch) < 256 {
			select {
			case it := <-s.auditQ:
				batch = append(batch, it)
			default:
				break more
			}
		}
		recs = s.appendBatch(context.WithoutCancel(ctx), batch, recs)
	}
}

// appendBatch publishes batch as few messages as it can, every one in
// flight at once, waits for the stream to store each, and tells the items'
// waiters (each once the message holding its record is stored). recs is
// room for the records of a group, returned (cleared) for the next batch.
func (s *Server) appendBatch(ctx context.Context, batch []auditItem, recs []job.AuditRecord) []job.AuditRecord {
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
		s.log.ErrorContext(ctx, "append audit record", slog.String("kind", string(it.rec.Kind)), slog.String("job_id", it.rec.JobID), slog.Any("error", err))
	}
	if err := s.ensureAudit(ctx); err != nil {
		for _, it := range batch {
			fail(it, err)
		}
		return recs
	}
	groups := groupAudit(batch)
	futures := make([][]jetstream.PubAckFuture, len(groups))
	now := s.cfg.Now()
	for i, g := range groups {
		recs = recs[:0]
		for _, k := range g.items {
			recs = append(recs, batch[k].rec)
		}
		// The tenant's audit bounds: what is past them is not appended;
		// the day's first refusal is itself a record.
		kept, reached := audit.Admit(ctx, s.store, s.log, g.tenant, s.auditBound(g.tenant), recs, now)
		if reached != nil {
			s.log.WarnContext(ctx, "a tenant's audit log reached its bound for the day", slog.String("tenant", g.tenant), slog.String("detail", reached.Detail))
			if m, err := audit.Msg(g.tenant, *reached, "audit-bound:"+job.TenantToken(g.tenant)+":"+now.UTC().Format("20060102")); err == nil {
				if f, err := s.js.PublishMsgAsync(m); err == nil {
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
			if f, err = s.js.PublishMsgAsync(m); err == nil {
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
func (s *Server) auditBound(tenant string) audit.Bound {
	b := s.tenantBounds(tenant)
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
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request, caller string) {
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
	if err := s.ensureAudit(ctx); err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "read audit log", fmt.Errorf("%w", err)))
		return
	}
	recs, err := audit.Read(ctx, s.js, caller, kind, since, limit)
	if err != nil {
		writeProblem(w, s.problems.storeProblem(ctx, "read audit log", err))
		return
	}
	if recs == nil {
		recs = []job.AuditRecord{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
}
