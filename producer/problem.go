package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// problem is an RFC 9457 problem document, and the error type handlers
// return to choose one.
type problem struct {
	Type   job.ProblemType `json:"type"`
	Title  string          `json:"title"`
	Status int             `json:"status"`
	Detail string          `json:"detail,omitempty"`
	// Field is the JSON path of the offending input, e.g. "limits.memory_mb".
	Field string `json:"field,omitempty"`
	// Limit is the bound that was exceeded (bytes, jobs or ids).
	Limit int64 `json:"limit,omitempty"`
	// Checks says, for /readyz, which dependency failed.
	Checks map[string]string `json:"checks,omitempty"`
	// JobID names the job a 503 "outcome unknown" is about: it may run,
	// and GET /v1/jobs/{id} or a retry with the same Idempotency-Key tells.
	JobID string `json:"job_id,omitempty"`

	retryAfter time.Duration
	cause      error
}

func (p *problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail) }
func (p *problem) Unwrap() error { return p.cause }

func newProblem(status int, typ job.ProblemType, title, detail string) *problem {
	return &problem{Type: typ, Title: title, Status: status, Detail: detail}
}

func badParam(name, detail string) *problem {
	p := newProblem(http.StatusBadRequest, job.ProblemInvalidParameter, "Invalid query parameter", detail)
	p.Field = name
	return p
}

func invalidID(id string) *problem {
	p := newProblem(http.StatusBadRequest, job.ProblemInvalidID, "Invalid job id",
		fmt.Sprintf("%q is not a job id: ids look like 0190a5e4-7b1c-7d2e-8f3a-123456789abc (lower-case UUIDv7)", id))
	p.Field = "id"
	return p
}

func notFound(id string) *problem {
	return newProblem(http.StatusNotFound, job.ProblemNotFound, "Job not found",
		fmt.Sprintf("no job %s: it never existed, its record expired, or it was answered from the result cache (those are not stored)", id))
}

// problems maps errors to the problems routes answer: toProblem is the one
// mapping, shared by every route type. It holds the Retry-After delays the
// mapping sets and the logger of the failures it reports.
type problems struct {
	log                 *slog.Logger
	retryAfter          time.Duration // Config.RetryAfter
	queueFullRetryAfter time.Duration // Config.QueueFullRetryAfter
}

// storeProblem turns a Store error into the problem to answer, or nil when
// err is nil.
func (s *problems) storeProblem(ctx context.Context, op string, err error) *problem {
	var p *problem
	switch {
	case err == nil:
		return nil
	case errors.As(err, &p):
		return p
	case errors.Is(err, cache.ErrUnavailable):
		p = newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "Job store unavailable",
			"the job store (Redis) cannot be reached right now; nothing was changed, retry after the Retry-After delay")
		p.retryAfter = s.retryAfter
		p.cause = err
		s.log.WarnContext(ctx, "redis unavailable", slog.String("op", op), slog.Any("error", err))
		return p
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		p = newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "Request interrupted",
			"the request ended before the job store answered; retry")
		p.retryAfter = s.retryAfter
		p.cause = err
		return p
	}
	s.log.ErrorContext(ctx, "internal error", slog.String("op", op), slog.Any("error", err))
	p = newProblem(http.StatusInternalServerError, job.ProblemInternal, "Internal error", op+" failed; the error was logged")
	p.cause = err
	return p
}

// toProblem is the one mapping from the errors of handlers and domain calls
// to the problems every transport answers: *problem as is, a domain error
// (errors.go) by refusalProblem, an empty runtime registry as 503 with
// Retry-After, *job.InvalidError as 422 naming the field, Store errors by
// storeProblem.
func (s *problems) toProblem(ctx context.Context, op string, err error) *problem {
	var p *problem
	if errors.As(err, &p) {
		return p
	}
	var r *refusal
	if errors.As(err, &r) {
		return s.refusalProblem(r)
	}
	if errors.Is(err, errNoRuntimes) {
		p := newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "No runtime registered", err.Error()+"; retry after Retry-After")
		p.Field, p.retryAfter = "runtime", s.retryAfter
		return p
	}
	var ie *job.InvalidError
	if errors.As(err, &ie) {
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemInvalidField, "Invalid job spec", ie.Message)
		p.Field = ie.Field
		return p
	}
	return s.storeProblem(ctx, op, err)
}

// refusalProblem is toProblem's answer to a domain error: the status, type,
// title and Retry-After of its kind, with the refusal's detail, field,
// bound and job.
func (s *problems) refusalProblem(r *refusal) *problem {
	var p *problem
	switch r.kind {
	case errIdempotencyKeyReused:
		p = newProblem(http.StatusUnprocessableEntity, job.ProblemIdempotencyKeyReused, "Idempotency-Key reused", r.detail)
	case errQueueFull:
		p = newProblem(http.StatusTooManyRequests, job.ProblemQueueFull, "Job queue full",
			"the job queue is at its limit; nothing was queued, retry after the Retry-After delay")
		p.retryAfter = s.queueFullRetryAfter
	case errQueueUnavailable:
		p = newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "Job queue unavailable",
			"the job queue (NATS JetStream) cannot take the job right now; nothing was queued, retry after the Retry-After delay")
		p.retryAfter = s.retryAfter
	case errPublishUnconfirmed:
		id := r.recorded
		p = newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "Job queue did not confirm",
			"the job queue (NATS JetStream) did not confirm job "+id+" in time; it may have been queued. "+
				"Retry with the same Idempotency-Key to get this job (it will be queued exactly once), or read GET /v1/jobs/"+id)
		p.JobID = id
		p.retryAfter = s.retryAfter
	case errQuotaExceeded:
		p = newProblem(http.StatusTooManyRequests, job.ProblemType(job.QuotaProblemType(r.quota)), "Quota exceeded: "+string(r.quota), r.detail)
	case errBudgetInvalid:
		p = newProblem(http.StatusUnprocessableEntity, job.ProblemInvalidField, "Invalid job spec", r.detail)
	case errBudgetExhausted:
		p = newProblem(http.StatusConflict, job.ProblemBudgetExhausted, "Budget exhausted", r.detail)
	case errEgressNotAllowed:
		p = newProblem(http.StatusUnprocessableEntity, job.ProblemEgressNotAllowed, "Egress not allowed", r.detail)
	case errFileNotFound:
		p = newProblem(http.StatusNotFound, job.ProblemNotFound, "File not found", r.detail)
	case errCommandNotFound:
		p = newProblem(http.StatusNotFound, job.ProblemNotFound, "Command not found", r.detail)
	case errStdinClosed:
		p = newProblem(http.StatusConflict, job.ProblemStdinClosed, "Stdin closed", r.detail)
	default:
		if title, ok := errFileConflicts[r.kind]; ok {
			p = newProblem(http.StatusConflict, job.ProblemFileConflict, title, r.detail)
			break
		}
		p = newProblem(http.StatusInternalServerError, job.ProblemInternal, "Internal error", "the error was logged")
	}
	if r.recorded != "" && (r.kind == errQueueFull || r.kind == errQueueUnavailable) {
		// Nothing was queued this time either; the record stays for the
		// reconciler or the client's next retry.
		p.Detail += "; the job " + r.recorded + " is recorded and will be queued when the queue is back: retry with the same Idempotency-Key"
		p.JobID = r.recorded
	}
	p.Field, p.Limit = r.field, r.limit
	if r.retryAfter > 0 {
		p.retryAfter = r.retryAfter
	}
	p.cause = r
	return p
}

func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((p.retryAfter+time.Second-1)/time.Second)))
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="kiln"`)
	}
	b, _ := marshal(p)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}

// marshal encodes v as one line of JSON without HTML escaping, so program
// output such as "<b>" reads as written.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := encodeJSON(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// encodeJSON appends marshal's encoding of v to buf.
func encodeJSON(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// answerBufs holds buffers for writeJSON's encoding: an answer is copied
// into the connection's buffer or written out by Write, so its buffer is
// free again once Write returns.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledAnswer bounds a buffer kept for the next answer.
const maxPooledAnswer = 64 << 10

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := answerBufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	if err := encodeJSON(buf, v); err != nil {
		writeProblem(w, newProblem(http.StatusInternalServerError, job.ProblemInternal, "Internal error", "encoding the answer failed"))
		return
	}
	writeJSONBytes(w, status, buf.Bytes())
}

// writeJSONBytes answers status with b, an encoded JSON answer.
func writeJSONBytes(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
