package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// ensureJobIO creates (or updates) the object store bucket, the events
// stream and the audit stream this worker writes to.
func (w *Worker) ensureJobIO(ctx context.Context) error {
	if err := w.objects.open(ctx); err != nil {
		return err
	}
	if _, err := events.Ensure(ctx, w.js, w.cfg.Events); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := audit.EnsureExists(ctx, w.js); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// runRequest is the request the job's run is made of: its output tapped
// into live events, its artifacts stored under the job's tenant, its network
// served by the job's egress proxy (egress.go), whose records go to the
// run's audit. Close the returned Output when the run is over. An artifact
// its tenant's stored-content bound refuses is noted in refusal. Live
// output is redacted by the run's detector as it streams.
func (d *delivery) runRequest(ctx context.Context, refusal *storedRefusal) (sandboxapi.Request, *events.Output) {
	w, log, m := d.w, d.log, d.m
	out := events.NewRedactedOutput(w.cfg.NATS, m.ID, m.Spec.Limits.OutputBytes, d.red, func(err error) {
		log.DebugContext(ctx, "publish output event", slog.Any("error", err))
	})
	tenant := m.TenantOrDefault()
	return sandboxapi.Request{
		ID:             m.ID,
		Spec:           m.Spec,
		Tenant:         tenant,
		DedicatedBoxes: m.Quota != nil && m.Quota.DedicatedBoxes,
		Output:         out.Write,
		Store: func(ctx context.Context, ref job.ObjectRef, r io.Reader) error {
			ref.Tenant = tenant
			return w.objects.put(ctx, m, ref, r, refusal)
		},
		Network: w.egress.network(ctx, log, m, d.audit),
	}, out
}

// publishStatus sends a status event; a failure only costs live viewers.
func (d *delivery) publishStatus(ctx context.Context, st job.Status) {
	w, log, id := d.w, d.log, d.m.ID
	if err := events.Status(w.cfg.NATS, id, st, w.cfg.ID); err != nil {
		log.WarnContext(ctx, "publish status event", slog.Any("error", err))
	}
}
