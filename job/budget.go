package job

import (
	"fmt"
	"regexp"
	"time"
)

// BudgetLimits caps what the runs naming one budget may use together
// (POST /v1/budgets). A zero field does not limit; at least one must.
type BudgetLimits struct {
	MaxRuns          int64 `json:"max_runs,omitempty"`
	MaxCPUMS         int64 `json:"max_cpu_ms,omitempty"`
	MaxWallMS        int64 `json:"max_wall_ms,omitempty"`
	MaxArtifactBytes int64 `json:"max_artifact_bytes,omitempty"`
}

// BudgetUse is an amount of a budget: what runs used, or what runs in
// flight hold.
type BudgetUse struct {
	Runs          int64 `json:"runs"`
	CPUMS         int64 `json:"cpu_ms"`
	WallMS        int64 `json:"wall_ms"`
	ArtifactBytes int64 `json:"artifact_bytes"`
}

// Budget is a budget as GET /v1/budgets/{id} shows it.
type Budget struct {
	ID string `json:"id"`
	BudgetLimits
	// Used is what the runs that ended used; Reserved what the jobs
	// accepted and not yet ended hold (their limits).
	Used      BudgetUse `json:"used"`
	Reserved  BudgetUse `json:"reserved"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Bounds of a budget.
const (
	BudgetExpiresDefault = 24 * time.Hour
	BudgetExpiresMax     = 30 * 24 * time.Hour
)

// Validate reports limits that make no budget.
func (l BudgetLimits) Validate() error {
	switch {
	case l.MaxRuns < 0, l.MaxCPUMS < 0, l.MaxWallMS < 0, l.MaxArtifactBytes < 0:
		return fmt.Errorf("budget limits must not be negative")
	case l == BudgetLimits{}:
		return fmt.Errorf("a budget needs at least one of max_runs, max_cpu_ms, max_wall_ms, max_artifact_bytes")
	}
	return nil
}

var budgetID = regexp.MustCompile(`^bud_[0-9a-f]{32}$`)

// ValidBudgetID reports whether s has the shape of a budget id.
func ValidBudgetID(s string) bool { return budgetID.MatchString(s) }
