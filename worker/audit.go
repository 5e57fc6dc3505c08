package worker

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/job"
)

// auditResult appends the recorded result of m to its tenant's audit log:
// status, exit code and the SHA-256 of each output, never the output. Its
// message id makes a second append for the same job a no-op.
func (w *Worker) auditResult(ctx context.Context, log *slog.Logger, m job.Message, r job.Result) {
	out := map[string]string{"stdout": job.OutputSHA256(&r, "stdout"), "stderr": job.OutputSHA256(&r, "stderr")}
	for _, a := range r.Artifacts {
		out["artifact:"+a.Name] = a.SHA256
	}
	rec := job.AuditRecord{Kind: job.AuditResult, JobID: m.ID, Runtime: m.Spec.Runtime, Digest: r.Image.Digest,
		Status: r.Status, ExitCode: r.ExitCode, Outputs: out, Budget: m.Spec.Budget, ReplayOf: m.ReplayOf}
	if r.Error != nil {
		rec.Detail = string(r.Error.Category)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := audit.Append(actx, w.js, m.TenantOrDefault(), rec, "result:"+m.ID); err != nil {
		log.WarnContext(ctx, "append the result to the tenant's audit log", slog.Any("error", err))
	}
}

// auditSessionResult appends the result of call seq of session rec to its
// tenant's audit log, as auditResult does a job's.
func (w *Worker) auditSessionResult(ctx context.Context, log *slog.Logger, sessionID, tenant, runtime string, seq int64, r job.Result) {
	out := map[string]string{"stdout": job.OutputSHA256(&r, "stdout"), "stderr": job.OutputSHA256(&r, "stderr")}
	rec := job.AuditRecord{Kind: job.AuditSessionResult, SessionID: sessionID, Call: seq, Runtime: runtime, Digest: r.Image.Digest,
		Status: r.Status, ExitCode: r.ExitCode, Outputs: out}
	if r.Error != nil {
		rec.Detail = string(r.Error.Category)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := audit.Append(actx, w.js, tenant, rec, "session-result:"+sessionID+":"+strconv.FormatInt(seq, 10)); err != nil {
		log.WarnContext(ctx, "append a session call's result to the tenant's audit log", slog.Any("error", err))
	}
}
