package client

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Error is an error answer of the API: the problem document it sent, the
// HTTP status, and Retry-After when the server gave one.
type Error struct {
	Status     int    // HTTP status, e.g. 422
	Type       string // problem type URN, e.g. "urn:kiln:problem:invalid-field"
	Title      string // short summary
	Detail     string // what is wrong and what to send instead
	Field      string // offending input, e.g. "limits.memory_mb"
	Limit      int64  // the bound exceeded, when one was
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kiln: %d %s", e.Status, e.Title)
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if e.Field != "" {
		b.WriteString(" (field " + e.Field + ")")
	}
	return b.String()
}

// Temporary reports whether the same request may succeed later unchanged
// (429 and 5xx answers).
func (e *Error) Temporary() bool {
	return e.Status == http.StatusTooManyRequests || e.Status >= 500
}

type problemJSON struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
	Limit  int64  `json:"limit"`
}

func (p *problemJSON) toError(status int) *Error {
	return &Error{Status: status, Type: p.Type, Title: p.Title, Detail: p.Detail, Field: p.Field, Limit: p.Limit}
}

// errorFromResponse builds an *Error from a non-2xx answer, whether or not
// it is a problem document (a proxy in between may answer in HTML).
func errorFromResponse(resp *http.Response, body []byte) *Error {
	var p problemJSON
	var e *Error
	if json.Unmarshal(body, &p) == nil && p.Title != "" {
		e = p.toError(resp.StatusCode)
	} else {
		detail := strings.TrimSpace(string(body))
		if len(detail) > 200 {
			detail = detail[:200] + "..."
		}
		e = &Error{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode), Detail: detail}
	}
	if v := resp.Header.Get("Retry-After"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// Sentinels for the API's problem types, matched with errors.Is:
//
//	if errors.Is(err, client.ErrQueueFull) { ... }
//
// An *Error matches the sentinel of its Type; errors.As still gives the
// *Error with its Field, Limit and RetryAfter.
var (
	ErrMalformedJSON        error = problemSentinel(job.ProblemMalformedJSON)
	ErrUnknownField         error = problemSentinel(job.ProblemUnknownField)
	ErrUnsupportedMediaType error = problemSentinel(job.ProblemUnsupportedMediaType)
	ErrBodyTooLarge         error = problemSentinel(job.ProblemBodyTooLarge)
	ErrInvalidField         error = problemSentinel(job.ProblemInvalidField)
	ErrBatchTooLarge        error = problemSentinel(job.ProblemBatchTooLarge)
	ErrInvalidParameter     error = problemSentinel(job.ProblemInvalidParameter)
	ErrInvalidID            error = problemSentinel(job.ProblemInvalidID)
	ErrNotFound             error = problemSentinel(job.ProblemNotFound)
	ErrMethodNotAllowed     error = problemSentinel(job.ProblemMethodNotAllowed)
	ErrIdempotencyKeyReused error = problemSentinel(job.ProblemIdempotencyKeyReused)
	ErrUnauthorized         error = problemSentinel(job.ProblemUnauthorized)
	ErrQueueFull            error = problemSentinel(job.ProblemQueueFull)
	ErrUnavailable          error = problemSentinel(job.ProblemUnavailable)
	ErrInternal             error = problemSentinel(job.ProblemInternal)
	// ErrFileConflict: a session's files make the file operation
	// impossible (something in the way); not retryable as it is.
	ErrFileConflict error = problemSentinel(job.ProblemFileConflict)
	// ErrStdinClosed: a write to a session command's stdin found it
	// closed; not retryable.
	ErrStdinClosed error = problemSentinel(job.ProblemStdinClosed)
)

// problemSentinel is the errors.Is target for one problem type.
type problemSentinel job.ProblemType

func (p problemSentinel) Error() string { return "kiln: problem " + string(p) }

// Is reports whether target is the sentinel of e's problem type.
func (e *Error) Is(target error) bool {
	s, ok := target.(problemSentinel)
	return ok && string(s) == e.Type
}
