package callback

import (
	"context"
	"errors"
	"fmt"

	"github.com/kilnrun/kiln/job"
)

// Secrets returns a tenant's signing secret, false when it has none.
type Secrets func(tenant string) ([]byte, bool)

// Policy is what the API checks when a job names a callback_url: the tenant
// has a signing secret and the URL's addresses may be called back.
type Policy struct {
	Guard   *Guard
	Secrets Secrets
}

// Check returns a *job.InvalidError for field callback_url saying why the
// URL is refused, or nil. A host that does not resolve is refused too: it
// could not be called back now either.
func (p Policy) Check(ctx context.Context, tenant, rawURL string) error {
	const field = "callback_url"
	if _, ok := p.Secrets(tenant); !ok {
		return &job.InvalidError{Field: field, Message: fmt.Sprintf(
			"no callback signing secret is configured for API key %q; the operator adds one as NAME:KEY:SECRET in the API key file", tenant)}
	}
	if err := p.Guard.CheckURL(ctx, rawURL); err != nil {
		if errors.Is(err, ErrRefusedAddress) {
			return &job.InvalidError{Field: field, Message: fmt.Sprintf(
				"%v; callbacks go to public addresses only, unless the operator allows the network (--callback-allow-networks)", unwrapRefusal(err))}
		}
		return &job.InvalidError{Field: field, Message: fmt.Sprintf("callback_url cannot be checked: %v", err)}
	}
	return nil
}

// unwrapRefusal drops the sentinel's own text from a refusal, leaving "host
// h resolves to 10.0.0.1, a private address".
func unwrapRefusal(err error) string {
	const prefix = "callback address refused: "
	s := err.Error()
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return "callback_url refused: " + s[len(prefix):]
	}
	return s
}
