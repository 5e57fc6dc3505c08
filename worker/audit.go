package worker

import (
	"context"
	"log/slog"
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
