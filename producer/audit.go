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

	"go.opentelemetry.io/otel/trace"

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

// withAuditKey notes in ctx which API key made the request.
func withAuditKey(r *http.Request) *http.Request {
	_, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || strings.TrimSpace(token) == "" {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), auditKeyCtx{}, audit.KeyID(strings.TrimSpace(token))))
}

func auditKey(ctx context.Context) string { v, _ := ctx.Value(auditKeyCtx{}).(string); return v }

// appendAudit adds rec to tenant's audit log. The request it records has
// happened: a failure is logged, not answered.
func (s *Server) appendAudit(ctx context.Context, tenant string, rec job.AuditRecord) {
	rec.Key = auditKey(ctx)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := s.ensureAudit(actx)
	if err == nil {
		err = audit.Append(actx, s.js, tenant, rec, "")
	}
	if err != nil {
		s.log.ErrorContext(ctx, "append audit record", slog.String("kind", string(rec.Kind)), slog.String("job_id", rec.JobID), slog.Any("error", err))
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

// submitAudited is submit, recorded in the tenant's audit log: an accepted
// job as a submission (or a replay), a budget's refusal as such.
func (s *Server) submitAudited(ctx context.Context, span trace.Span, sub submission) (outcome, error) {
	out, err := s.submit(ctx, span, sub)
	spec := sub.spec
	rec := job.AuditRecord{Kind: job.AuditSubmission, Runtime: spec.Runtime, CodeSHA256: job.CodeSHA256(spec.Code),
		Inputs: specInputs(spec), Budget: spec.Budget, ReplayOf: sub.replayOf}
	if sub.replayOf != "" {
		rec.Kind = job.AuditReplay
	}
	if err != nil {
		var p *problem
		if errors.As(err, &p) && p.Type == typeBudgetExhausted {
			rec.Kind, rec.Detail = job.AuditBudgetRefusal, p.Detail
			s.appendAudit(ctx, sub.caller, rec)
		}
		return out, err
	}
	rec.JobID = out.id
	if rt, lerr := s.runtimes.lookup(ctx, cmpRuntime(spec.Runtime)); lerr == nil {
		rec.Runtime, rec.Digest = rt.Name, rt.Digest
	}
	if out.status == http.StatusOK {
		if r, ok := out.body.(*resultView); ok {
			rec.CacheHit = r.CacheHit
		}
	}
	s.appendAudit(ctx, sub.caller, rec)
	return out, nil
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
		writeProblem(w, s.storeProblem(ctx, "read audit log", fmt.Errorf("%w", err)))
		return
	}
	recs, err := audit.Read(ctx, s.js, caller, kind, since, limit)
	if err != nil {
		writeProblem(w, s.storeProblem(ctx, "read audit log", err))
		return
	}
	if recs == nil {
		recs = []job.AuditRecord{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
}
