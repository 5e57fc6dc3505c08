package worker

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
	"github.com/nats-io/nats.go/jetstream"
)

// runAudit is what one run (a job's delivery, or a session's call) appends
// to its tenant's audit log, held until the stream has stored it: the run's
// result is acknowledged only after (flush), so a NATS outage delays the
// log and never loses from it. Egress connections come in as the proxy
// ends them; refused ones are folded, one record per host, port and reason
// (and one for all those past the connection cap) with a count, so a job
// hammering its proxy adds a handful of records, not one per refusal.
// Every record counts against the tenant's audit bounds (audit.Admit).
type runAudit struct {
	sink   *auditLog
	log    *slog.Logger
	id     string // the run's id: a job's, or a session call's events id
	tenant string
	bound  audit.Bound
	red    *redact.Detector

	mu      sync.Mutex
	pending []auditEntry           // made, in order, not yet stored
	folded  map[foldKey]*foldEntry // refused connections by kind
	order   []foldKey              // folded's keys in the order they came
}

// auditEntry is a record and the message id that keeps it once.
type auditEntry struct {
	rec   job.AuditRecord
	msgID string
}

// foldKey groups refused connections: by host, port and reason, or all
// those past the cap together.
type foldKey struct {
	capped bool
	host   string
	port   int
	reason string
}

type foldEntry struct {
	rec job.AuditRecord // the first refusal
	n   int64
}

// auditLog is where runs append to their tenants' audit logs: the
// KILN_AUDIT stream, within each tenant's daily bounds counted in the store.
type auditLog struct {
	js    jetstream.JetStream
	store Store
	clock Clock
}

// newRun is the audit of run id of tenant, bounded by q, its egress
// records redacted by red.
func (l *auditLog) newRun(log *slog.Logger, id, tenant string, q *job.TenantQuota, red *redact.Detector) *runAudit {
	return &runAudit{sink: l, log: log, id: id, tenant: tenant, bound: audit.BoundOf(q), red: red, folded: map[foldKey]*foldEntry{}}
}

// egress takes the record of one connection of the run, kind egress,
// redacted as the result's egress records are. capped: refused past the
// job's connection cap.
func (a *runAudit) egress(runtime string, r job.EgressRecord, capped bool) {
	a.red.Value(&r)
	rec := job.AuditRecord{Kind: job.AuditEgress, JobID: a.id, Runtime: runtime, Egress: &r}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Allowed {
		a.pending = append(a.pending, auditEntry{rec: rec, msgID: "egress:" + a.id + ":" + strconv.Itoa(len(a.pending))})
		return
	}
	k := foldKey{capped: true}
	if !capped {
		k = foldKey{host: r.Host, port: r.Port, reason: r.Reason}
	}
	if f := a.folded[k]; f != nil {
		f.n++
		return
	}
	a.folded[k] = &foldEntry{rec: rec, n: 1}
	a.order = append(a.order, k)
}

// add takes a record to append with the run's others.
func (a *runAudit) add(rec job.AuditRecord, msgID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, auditEntry{rec: rec, msgID: msgID})
}

// flush appends the run's records that fit its tenant's bounds and waits
// until the stream has stored each, retrying while it cannot be reached,
// until ctx ends (the worker's hard stop): the error then says records
// were left. What the bound leaves out is counted, and the tenant's first
// refusal of the day is itself a record.
func (a *runAudit) flush(ctx context.Context) error {
	// The run's connections first, then what was added (its result).
	a.mu.Lock()
	var entries, added []auditEntry
	for _, e := range a.pending {
		if e.rec.Kind == job.AuditEgress {
			entries = append(entries, e)
		} else {
			added = append(added, e)
		}
	}
	for i, k := range a.order {
		f := a.folded[k]
		rec := f.rec
		if f.n > 1 {
			rec.Count = f.n
		}
		entries = append(entries, auditEntry{rec: rec, msgID: "egress-refused:" + a.id + ":" + strconv.Itoa(i)})
	}
	entries = append(entries, added...)
	a.pending, a.folded, a.order = nil, map[foldKey]*foldEntry{}, nil
	a.mu.Unlock()
	if len(entries) == 0 {
		return nil
	}
	now := a.sink.clock.Now()
	recs := make([]job.AuditRecord, len(entries))
	for i, e := range entries {
		if e.rec.Time.IsZero() {
			e.rec.Time = now.UTC()
		}
		entries[i], recs[i] = e, e.rec
	}
	kept, reached := audit.Admit(ctx, a.sink.store, a.log, a.tenant, a.bound, recs, now)
	if reached != nil {
		a.log.WarnContext(ctx, "the tenant's audit log reached its bound for the day", slog.String("tenant", a.tenant), slog.String("detail", reached.Detail))
		id := "audit-bound:" + job.TenantToken(a.tenant) + ":" + now.UTC().Format("20060102")
		if err := a.sink.append(ctx, a.log, a.tenant, *reached, id); err != nil {
			return err
		}
	}
	if kept < len(entries) {
		a.log.DebugContext(ctx, "audit records past the tenant's bound not kept", slog.Int("records", len(entries)-kept))
	}
	for _, e := range entries[:kept] {
		if err := a.sink.append(ctx, a.log, a.tenant, e.rec, e.msgID); err != nil {
			return err
		}
	}
	return nil
}

// auditTry bounds one attempt to append a record; auditRetryMax the wait
// between attempts while the stream cannot be reached.
const (
	auditTry      = 5 * time.Second
	auditRetryMax = 3 * time.Second
)

// append appends rec to tenant's log and waits until the stream has
// stored it, trying again while it cannot be reached, until ctx ends. Its
// message id makes a second append of the same record (an attempt whose
// answer was lost) a no-op.
func (l *auditLog) append(ctx context.Context, log *slog.Logger, tenant string, rec job.AuditRecord, msgID string) error {
	delay := 100 * time.Millisecond
	for warned := false; ; {
		actx, cancel := context.WithTimeout(ctx, auditTry)
		err := audit.Append(actx, l.js, tenant, rec, msgID)
		cancel()
		if err == nil {
			if warned {
				log.InfoContext(ctx, "audit record appended after the stream came back", slog.String("kind", string(rec.Kind)))
			}
			return nil
		}
		if !warned {
			log.WarnContext(ctx, "append to the tenant's audit log; holding the run's records and trying again", slog.String("kind", string(rec.Kind)), slog.Any("error", err))
			warned = true
		}
		if !sleep(ctx, delay) {
			log.ErrorContext(ctx, "the worker is stopping with audit records not stored; the job's redelivery appends its result's", slog.String("kind", string(rec.Kind)), slog.Any("error", err))
			return err
		}
		delay = min(delay*2, auditRetryMax)
	}
}

// resultRecord is the audit record of m's recorded result r: status, exit
// code and the SHA-256 of each output, never the output.
func resultRecord(m job.Message, r job.Result) job.AuditRecord {
	out := map[string]string{"stdout": job.OutputSHA256(&r, "stdout"), "stderr": job.OutputSHA256(&r, "stderr")}
	for _, a := range r.Artifacts {
		out["artifact:"+a.Name] = a.SHA256
	}
	rec := job.AuditRecord{Kind: job.AuditResult, JobID: m.ID, Runtime: m.Spec.Runtime, Digest: r.Image.Digest,
		Status: r.Status, ExitCode: r.ExitCode, Outputs: out, Budget: m.Spec.Budget, ReplayOf: m.ReplayOf}
	if r.Error != nil {
		rec.Detail = string(r.Error.Category)
	}
	return rec
}

// resultMsgID keeps a job's result record once, however often it is
// appended (a redelivered job's).
func resultMsgID(id string) string { return "result:" + id }

// auditStoredResult appends the result record of m, a job found terminal
// on a redelivery, from its stored result: the attempt that recorded it
// may have stopped before its records were stored. Within the stream's
// duplicate window a record already stored is not appended twice.
func (d *delivery) auditStoredResult(ctx context.Context) error {
	w, log, m := d.w, d.log, d.m
	rec, err := w.cfg.Store.GetJob(ctx, m.ID)
	if err != nil || rec.Result == nil {
		return nil // nothing to record: the record expired or holds no result
	}
	a := w.audit.newRun(log, m.ID, m.TenantOrDefault(), m.Quota, nil)
	a.add(resultRecord(rec.Message, *rec.Result), resultMsgID(m.ID))
	return a.flush(ctx)
}

// sessionResultRecord is the audit record of call seq of a session, as
// resultRecord is a job's.
func sessionResultRecord(sessionID, runtime string, seq int64, r job.Result) job.AuditRecord {
	out := map[string]string{"stdout": job.OutputSHA256(&r, "stdout"), "stderr": job.OutputSHA256(&r, "stderr")}
	rec := job.AuditRecord{Kind: job.AuditSessionResult, SessionID: sessionID, Call: seq, Runtime: runtime, Digest: r.Image.Digest,
		Status: r.Status, ExitCode: r.ExitCode, Outputs: out}
	if r.Error != nil {
		rec.Detail = string(r.Error.Category)
	}
	return rec
}

// sessionResultMsgID keeps a session call's result record once.
func sessionResultMsgID(sessionID string, seq int64) string {
	return "session-result:" + sessionID + ":" + strconv.FormatInt(seq, 10)
}
