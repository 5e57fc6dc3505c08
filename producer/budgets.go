package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// BudgetStore keeps budgets (cache/budget.go).
type BudgetStore interface {
	CreateBudget(ctx context.Context, tenant string, b job.Budget) error
	GetBudget(ctx context.Context, tenant, id string, now time.Time) (job.Budget, error)
	ReserveBudget(ctx context.Context, tenant, id, jobID string, l job.Limits, deadline, now time.Time) (cache.BudgetReservation, error)
	SettleBudget(ctx context.Context, tenant, id, jobID string, ran bool, use job.BudgetUse) (bool, error)
}

// budgetRequest is the body of POST /v1/budgets.
type budgetRequest struct {
	job.BudgetLimits
	// ExpiresS is the budget's lifetime in seconds. Default 86400 (a day),
	// at most 30 days.
	ExpiresS int64 `json:"expires_s,omitempty"`
}

var budgetSchema = &fieldSchema{fields: map[string]*fieldSchema{
	"max_runs": nil, "max_cpu_ms": nil, "max_wall_ms": nil, "max_artifact_bytes": nil, "expires_s": nil,
}}

// budgetReserveWindow is how long the API's reservation for a job lasts
// without its run starting; the worker renews it as the run starts.
const budgetReserveWindow = time.Hour

func newBudgetID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "bud_" + hex.EncodeToString(b[:])
}

func budgetNotFound(id string) *problem {
	return newProblem(http.StatusNotFound, job.ProblemNotFound, "Budget not found",
		fmt.Sprintf("no budget %s: it never existed, or it expired", id))
}

// budgetExhausted is the refusal of a job that b cannot cover.
func budgetExhausted(b job.Budget, l job.Limits) error {
	why := ""
	left := func(limit, used, held int64) int64 { return max(0, limit-used-held) }
	switch {
	case b.MaxRuns > 0 && b.Used.Runs+b.Reserved.Runs+1 > b.MaxRuns:
		why = fmt.Sprintf("all %d runs are used or held (%d ended, %d accepted and not yet ended)", b.MaxRuns, b.Used.Runs, b.Reserved.Runs)
	case b.MaxCPUMS > 0 && b.Used.CPUMS+b.Reserved.CPUMS+l.CPUMS > b.MaxCPUMS:
		why = fmt.Sprintf("the job's limits.cpu_ms %d exceeds the %d ms of CPU left of %d (%d used, %d held by jobs in flight)",
			l.CPUMS, left(b.MaxCPUMS, b.Used.CPUMS, b.Reserved.CPUMS), b.MaxCPUMS, b.Used.CPUMS, b.Reserved.CPUMS)
	case b.MaxWallMS > 0 && b.Used.WallMS+b.Reserved.WallMS+l.TimeoutMS > b.MaxWallMS:
		why = fmt.Sprintf("the job's limits.timeout_ms %d exceeds the %d ms of run time left of %d (%d used, %d held by jobs in flight)",
			l.TimeoutMS, left(b.MaxWallMS, b.Used.WallMS, b.Reserved.WallMS), b.MaxWallMS, b.Used.WallMS, b.Reserved.WallMS)
	default:
		why = fmt.Sprintf("its %d artifact bytes are used (%d)", b.MaxArtifactBytes, b.Used.ArtifactBytes)
	}
	return &refusal{kind: errBudgetExhausted, field: "budget",
		detail: fmt.Sprintf("budget %s cannot cover this job: %s; the job was not queued and retrying will not help: lower the job's limits, or create a new budget", b.ID, why)}
}

// budgetHold is a submission's reservation of its budget: given back when
// the submission ends without queueing the job.
type budgetHold struct {
	b    *budgets
	m    job.Message
	kept bool
}

// keep marks the job queued: its worker settles the reservation.
func (h *budgetHold) keep() { h.kept = true }

// done gives the reservation back unless the job was queued.
func (h *budgetHold) done(ctx context.Context) {
	if !h.kept {
		h.b.releaseBudget(ctx, h.m)
	}
}

// budgets are tenants' execution budgets: created and read at
// /v1/budgets, reserved by each submission or session call that names one,
// settled by the worker that ran it.
type budgets struct {
	store    Store
	cfg      *Config // Now, BudgetMaxExpiry
	audit    *auditLog
	problems *problems
	log      *slog.Logger
}

// handleCreateBudget creates a budget of the caller's: POST /v1/budgets.
func (bu *budgets) handleCreateBudget(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	body, p := readBody(w, r, 64<<10)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var req budgetRequest
	if p := decodeChecked(body, &req, budgetSchema, ""); p != nil {
		writeProblem(w, p)
		return
	}
	invalid := func(field, detail string) {
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemInvalidField, "Invalid budget", detail)
		p.Field = field
		writeProblem(w, p)
	}
	if err := req.Validate(); err != nil {
		invalid("max_runs", err.Error())
		return
	}
	exp := time.Duration(req.ExpiresS) * time.Second
	switch {
	case req.ExpiresS < 0 || exp > job.BudgetExpiresMax:
		invalid("expires_s", fmt.Sprintf("expires_s %d must be between 1 and %d (30 days)", req.ExpiresS, int64(job.BudgetExpiresMax/time.Second)))
		return
	case req.ExpiresS == 0:
		exp = job.BudgetExpiresDefault
	}
	now := bu.cfg.Now().UTC().Truncate(time.Millisecond)
	b := job.Budget{ID: newBudgetID(), BudgetLimits: req.BudgetLimits, CreatedAt: now, ExpiresAt: now.Add(exp)}
	if err := bu.store.CreateBudget(ctx, caller, b); err != nil {
		writeProblem(w, bu.problems.storeProblem(ctx, "create budget", err))
		return
	}
	bu.audit.appendAudit(ctx, caller, job.AuditRecord{Kind: job.AuditBudgetCreated, Budget: b.ID,
		Detail: fmt.Sprintf("max_runs %d, max_cpu_ms %d, max_wall_ms %d, max_artifact_bytes %d, expires %s",
			b.MaxRuns, b.MaxCPUMS, b.MaxWallMS, b.MaxArtifactBytes, b.ExpiresAt.Format(time.RFC3339))})
	w.Header().Set("Location", "/v1/budgets/"+b.ID)
	writeJSON(w, http.StatusCreated, b)
}

// handleGetBudget shows a budget of the caller's and its use:
// GET /v1/budgets/{id}. Another tenant's budget is 404, as one that never
// existed.
func (bu *budgets) handleGetBudget(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidBudgetID(id) {
		p := newProblem(http.StatusBadRequest, job.ProblemInvalidID, "Invalid budget id",
			fmt.Sprintf("%q is not a budget id: ids look like bud_ and 32 hex digits", id))
		p.Field = "id"
		writeProblem(w, p)
		return
	}
	b, err := bu.store.GetBudget(ctx, caller, id, bu.cfg.Now())
	if errors.Is(err, cache.ErrNotFound) {
		writeProblem(w, budgetNotFound(id))
		return
	}
	if err != nil {
		writeProblem(w, bu.problems.storeProblem(ctx, "get budget", err))
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// reserveBudget reserves one run of the budget spec names for job id, as
// the job is accepted; the worker renews the reservation as the run starts
// and settles its real use as it ends. A budget that cannot cover the job
// refuses it with errBudgetExhausted (not retryable).
func (bu *budgets) reserveBudget(ctx context.Context, tenant, id string, spec job.Spec) error {
	if !job.ValidBudgetID(spec.Budget) {
		return &refusal{kind: errBudgetInvalid, field: "budget",
			detail: fmt.Sprintf("budget %q is not a budget id: create one with POST /v1/budgets and pass its id (bud_ and 32 hex digits)", spec.Budget)}
	}
	now := bu.cfg.Now()
	r, err := bu.store.ReserveBudget(ctx, tenant, spec.Budget, id, spec.Limits, now.Add(budgetReserveWindow+spec.Limits.Timeout()), now)
	if errors.Is(err, cache.ErrNotFound) {
		return &refusal{kind: errBudgetInvalid, field: "budget",
			detail: fmt.Sprintf("budget %s does not exist or expired: create one with POST /v1/budgets", spec.Budget)}
	}
	if err != nil {
		return err
	}
	if !r.OK {
		return budgetExhausted(r.Budget, spec.Limits)
	}
	return nil
}

// releaseBudget gives back job m's reservation when it will not run (its
// submission failed after reserving, it was coalesced onto another job, or
// it was canceled while queued).
func (bu *budgets) releaseBudget(ctx context.Context, m job.Message) {
	if m.Spec.Budget == "" {
		return
	}
	if _, err := bu.store.SettleBudget(context.WithoutCancel(ctx), m.TenantOrDefault(), m.Spec.Budget, m.ID, false, job.BudgetUse{}); err != nil {
		bu.log.WarnContext(ctx, "release budget reservation; it lapses by itself", slog.String("job_id", m.ID), slog.Any("error", err))
	}
}

// holdBudget reserves the job's budget, if it names one.
func (bu *budgets) holdBudget(ctx context.Context, tenant, id string, spec job.Spec) (*budgetHold, error) {
	if spec.Budget == "" {
		return &budgetHold{kept: true}, nil
	}
	if err := bu.reserveBudget(ctx, tenant, id, spec); err != nil {
		return nil, err
	}
	return &budgetHold{b: bu, m: job.Message{ID: id, Spec: spec, Tenant: tenant}}, nil
}
