package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Sentinels of the production controls' problems (see Err* in errors.go).
var (
	// ErrBudgetExhausted: the budget the job names cannot cover it;
	// retrying will not help.
	ErrBudgetExhausted error = problemSentinel(job.ProblemBudgetExhausted)
	// ErrReplayUnavailable: the job cannot be replayed as it ran.
	ErrReplayUnavailable error = problemSentinel(job.ProblemReplayUnavailable)
	// ErrEgressNotAllowed: job.Spec.Network names a host the API key does
	// not allow (or the key allows no network); retrying will not help.
	ErrEgressNotAllowed error = problemSentinel(job.ProblemEgressNotAllowed)
)

// BudgetRequest is what CreateBudget asks for: at least one Max* field;
// Expires zero takes the server's default (a day).
type BudgetRequest struct {
	job.BudgetLimits
	Expires time.Duration
}

// CreateBudget creates an execution budget; jobs naming its ID in
// job.Spec.Budget are refused with ErrBudgetExhausted once it cannot cover
// them. Not retried: a lost answer would leave an unknown budget behind.
func (c *Client) CreateBudget(ctx context.Context, req BudgetRequest) (job.Budget, error) {
	body := struct {
		job.BudgetLimits
		ExpiresS int64 `json:"expires_s,omitempty"`
	}{req.BudgetLimits, int64(req.Expires / time.Second)}
	var b job.Budget
	if _, err := c.do(ctx, http.MethodPost, "/v1/budgets", body, nil, &b); err != nil {
		return job.Budget{}, err
	}
	return b, nil
}

// GetBudget reads a budget with what its runs used and what jobs in flight
// hold.
func (c *Client) GetBudget(ctx context.Context, id string) (job.Budget, error) {
	var b job.Budget
	err := c.withRetries(ctx, false, func() error {
		b = job.Budget{}
		_, err := c.do(ctx, http.MethodGet, "/v1/budgets/"+url.PathEscape(id), nil, nil, &b)
		return err
	})
	if err != nil {
		return job.Budget{}, err
	}
	return b, nil
}

// Replay queues job id again as it ran (same code, inputs, limits and
// image digest); the new job's result has ReplayOf and Replay. Not retried
// (each call queues a job).
func (c *Client) Replay(ctx context.Context, id string) (Submission, error) {
	var s Submission
	status, err := c.do(ctx, http.MethodPost, jobPath(id)+"/replay", nil, nil, &s)
	if err != nil {
		return Submission{}, err
	}
	s.Accepted = status == http.StatusAccepted
	return s, nil
}

// Audit reads the caller's audit log from since on (zero: from the start),
// of kind (empty: all), oldest first, at most limit (0: the server's
// bound).
func (c *Client) Audit(ctx context.Context, since time.Time, kind job.AuditKind, limit int) ([]job.AuditRecord, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	if kind != "" {
		q.Set("kind", string(kind))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/audit"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Records []job.AuditRecord `json:"records"`
	}
	err := c.withRetries(ctx, false, func() error {
		out.Records = nil
		_, err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return out.Records, nil
}
