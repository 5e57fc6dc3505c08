package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"syscall"
	"time"
)

// RetryPolicy paces the retries of 429, 502, 503 and 504 answers and of
// network errors. The n-th retry waits a random time between half and all of
// min(MaxBackoff, InitialBackoff·2ⁿ), so clients that failed together do not
// come back together, and never less than the server's Retry-After.
type RetryPolicy struct {
	// MaxAttempts bounds the tries of one request, the first included.
	// Default 8; 1 turns retries off.
	MaxAttempts int
	// InitialBackoff is the first retry's upper bound. Default 200ms.
	InitialBackoff time.Duration
	// MaxBackoff caps one wait. Default 10s.
	MaxBackoff time.Duration
	// MaxElapsed: no retry starts after this long. Default 60s.
	MaxElapsed time.Duration
	// RefusedAtOnce makes a refused connection (nothing listens at the
	// address) fail at once rather than be waited out as a restart: for a
	// tool a person runs, who wants to hear that the server is not there.
	RefusedAtOnce bool
}

// Defaults of RetryPolicy.
const (
	MaxAttemptsDefault    = 8
	InitialBackoffDefault = 200 * time.Millisecond
	MaxBackoffDefault     = 10 * time.Second
	MaxElapsedDefault     = 60 * time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = MaxAttemptsDefault
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = InitialBackoffDefault
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = MaxBackoffDefault
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = MaxElapsedDefault
	}
	return p
}

// WithRetry sets the retry policy of Submit, Batch, Get, List, Cancel and
// Runtimes (Wait and WaitAll keep polling until their ctx ends).
func WithRetry(p RetryPolicy) Option { return func(c *Client) { c.retry = p.withDefaults() } }

// backoff is the wait before retry n (0-based), at least retryAfter.
func (p RetryPolicy) backoff(n int, retryAfter time.Duration) time.Duration {
	ceiling := p.InitialBackoff << min(n, 30)
	if ceiling > p.MaxBackoff || ceiling <= 0 {
		ceiling = p.MaxBackoff
	}
	d := ceiling/2 + rand.N(ceiling/2+1)
	if retryAfter > d {
		d = retryAfter + rand.N(min(retryAfter/10, time.Second)+1)
	}
	return d
}

// transientStatus: the same request may succeed later unchanged.
func transientStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryable reports whether err is worth retrying, and the server's
// Retry-After. onlyUnsent limits network errors to those after which the
// request surely never reached the server (connection refused).
func retryable(ctx context.Context, err error, onlyUnsent bool) (bool, time.Duration) {
	if ctx.Err() != nil {
		return false, 0
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return transientStatus(apiErr.Status), apiErr.RetryAfter
	}
	if onlyUnsent {
		return errors.Is(err, syscall.ECONNREFUSED), 0
	}
	var netErr *networkError
	return errors.As(err, &netErr), 0
}

// networkError marks a failure to send a request or read its answer.
type networkError struct{ err error }

func (e *networkError) Error() string { return e.err.Error() }
func (e *networkError) Unwrap() error { return e.err }

// withRetries runs call until it succeeds, fails for good, or the policy
// or ctx ends the retries; it returns the last error.
func (c *Client) withRetries(ctx context.Context, onlyUnsent bool, call func() error) error {
	p := c.retry
	start := time.Now()
	for n := 0; ; n++ {
		err := call()
		if err == nil {
			return nil
		}
		ok, after := retryable(ctx, err, onlyUnsent)
		if !ok || n+1 >= p.MaxAttempts || p.RefusedAtOnce && errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		d := p.backoff(n, after)
		if time.Since(start)+d > p.MaxElapsed {
			return err
		}
		if serr := sleep(ctx, d); serr != nil {
			return err
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
