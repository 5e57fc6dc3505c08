package producer

import (
	"context"

	"github.com/kilnrun/kiln/job"
)

// callbackView is the job's callback delivery state for GET /v1/jobs/{id}:
// pending with no attempt until the job ends and the first attempt is made.
func callbackView(m job.Message, st *job.CallbackState) *job.CallbackState {
	if m.Spec.CallbackURL == "" {
		return nil
	}
	if st != nil {
		return st
	}
	return &job.CallbackState{URL: m.Spec.CallbackURL, State: job.CallbackPending}
}

// checkCallback refuses a callback_url the server does not deliver to: all
// of them when callbacks are not configured, else what Config.Callbacks
// refuses (a private address, a tenant without a signing secret).
func (t *tenants) checkCallback(ctx context.Context, tenant, rawURL string) error {
	if rawURL == "" {
		return nil
	}
	if t.cfg.Callbacks == nil {
		return &job.InvalidError{Field: "callback_url", Message: "callbacks are not enabled on this server; poll GET /v1/jobs/{id} instead"}
	}
	return t.cfg.Callbacks.Check(ctx, tenant, rawURL)
}
