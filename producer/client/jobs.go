package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Links are the URLs the server offers for a job.
type Links struct {
	Self string `json:"self"`
	Wait string `json:"wait"`
}

// JobView is a job as the API shows it: for a terminal job its full Result
// (with queue_ms, attempt, worker, cache_hit, timestamps and trace_id
// filled); for a queued or running one only ID, Status, CreatedAt,
// StartedAt, Attempt, Worker and TraceID are set.
type JobView struct {
	job.Result
	// CancelRequested is true when a running job was asked to stop.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Metadata is the job's labels, as its submission sent them
	// (job.Spec.Metadata).
	Metadata job.Metadata `json:"metadata,omitempty"`
	// Links is nil for answers from the result cache (they are not stored).
	Links *Links `json:"links,omitempty"`
}

// Terminal reports whether the job has finished.
func (v JobView) Terminal() bool { return v.Status.Terminal() }

// Submission is the answer to Submit: a job that finished (from the result
// cache, or within WithWait) or one that was accepted and is queued or
// running. An identical job already in flight is answered with that job's id.
type Submission struct {
	JobView
	// Accepted is true for a 202 answer: the job has not finished yet.
	Accepted bool
}

// SubmitOption configures one Submit.
type SubmitOption func(*submitOptions)

type submitOptions struct {
	idempotencyKey string
	wait           time.Duration
}

// WithIdempotencyKey sets the submission's Idempotency-Key: the same key
// with the same spec answers with the same job. Without it Submit makes a
// new key per call, used by all of that call's retries.
func WithIdempotencyKey(key string) SubmitOption {
	return func(o *submitOptions) { o.idempotencyKey = key }
}

// WithWait asks the server to hold the answer until the job finishes or d
// passes (the server caps d, 60s by default).
func WithWait(d time.Duration) SubmitOption { return func(o *submitOptions) { o.wait = d } }

// Submit submits one job. It retries 429, 502, 503 and 504 answers and
// network errors (see RetryPolicy), every try with the same Idempotency-Key,
// so a retry whose first try did reach the server never makes a second job.
func (c *Client) Submit(ctx context.Context, spec job.Spec, opts ...SubmitOption) (Submission, error) {
	var o submitOptions
	for _, f := range opts {
		f(&o)
	}
	path := "/v1/jobs"
	if o.wait > 0 {
		path += "?wait=" + waitParam(o.wait)
	}
	hdr := http.Header{}
	hdr.Set("Idempotency-Key", cmp.Or(o.idempotencyKey, job.NewID()))
	var s Submission
	var status int
	err := c.withRetries(ctx, false, func() (err error) {
		s = Submission{}
		status, err = c.do(ctx, http.MethodPost, path, spec, hdr, &s.JobView)
		return err
	})
	if err != nil {
		return Submission{}, err
	}
	s.Accepted = status == http.StatusAccepted
	return s, nil
}

// Get reads a job. With wait > 0 the server holds the answer until the job
// finishes or wait passes (a long-poll); the job may still be unfinished.
func (c *Client) Get(ctx context.Context, id string, wait time.Duration) (JobView, error) {
	path := jobPath(id)
	if wait > 0 {
		path += "?wait=" + waitParam(wait)
	}
	var v JobView
	err := c.withRetries(ctx, false, func() error {
		v = JobView{}
		_, err := c.do(ctx, http.MethodGet, path, nil, nil, &v)
		return err
	})
	if err != nil {
		return JobView{}, err
	}
	return v, nil
}

// longPoll is the wait Wait asks for per request: the server's default cap.
const longPoll = 60 * time.Second

// Wait long-polls the job until it is terminal or ctx ends. It outlasts
// API restarts and outages: network errors and 429/502/503/504 answers are
// waited out (with backoff, at least the server's Retry-After) and polling
// resumes, for as long as ctx allows.
func (c *Client) Wait(ctx context.Context, id string) (JobView, error) {
	path := jobPath(id) + "?wait=" + waitParam(longPoll)
	for n := 0; ; {
		var v JobView
		_, err := c.do(ctx, http.MethodGet, path, nil, nil, &v)
		if err == nil {
			if v.Terminal() {
				return v, nil
			}
			n = 0
			continue
		}
		ok, after := retryable(ctx, err, false)
		if !ok || c.retry.RefusedAtOnce && errors.Is(err, syscall.ECONNREFUSED) {
			if ctx.Err() != nil {
				return JobView{}, fmt.Errorf("kiln client: wait for job %s: %w (last error: %w)", id, ctx.Err(), err)
			}
			return JobView{}, err
		}
		if serr := sleep(ctx, c.retry.backoff(n, after)); serr != nil {
			return JobView{}, fmt.Errorf("kiln client: wait for job %s: %w (last error: %w)", id, serr, err)
		}
		n++
	}
}

// Cancel cancels a job: a queued job becomes canceled at once; a running
// one is asked to stop (the answer then shows status running and
// CancelRequested); a finished one is left as it is.
func (c *Client) Cancel(ctx context.Context, id string) (JobView, error) {
	var v JobView
	err := c.withRetries(ctx, false, func() error {
		v = JobView{}
		_, err := c.do(ctx, http.MethodDelete, jobPath(id), nil, nil, &v)
		return err
	})
	if err != nil {
		return JobView{}, err
	}
	return v, nil
}

// List reads up to 100 jobs at once, in the order of ids. An unknown id
// gets a nil entry.
func (c *Client) List(ctx context.Context, ids []string) ([]*JobView, error) {
	// An unknown id comes back as {"id", "error": problem}, without status.
	var out struct {
		Jobs []JobView `json:"jobs"`
	}
	escaped := make([]string, len(ids))
	for i, id := range ids {
		escaped[i] = url.QueryEscape(id)
	}
	err := c.withRetries(ctx, false, func() error {
		out.Jobs = nil
		_, err := c.do(ctx, http.MethodGet, "/v1/jobs?ids="+strings.Join(escaped, ","), nil, nil, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	views := make([]*JobView, len(out.Jobs))
	for i := range out.Jobs {
		if out.Jobs[i].Status != "" {
			views[i] = &out.Jobs[i]
		}
	}
	return views, nil
}

// JobFilter selects the jobs ListJobs lists; zero fields select all.
type JobFilter struct {
	// Status lists only jobs of this status.
	Status job.Status
	// CreatedAfter and CreatedBefore bound the jobs' creation times
	// (exclusive, to the millisecond).
	CreatedAfter, CreatedBefore time.Time
	// Tags lists only jobs whose metadata holds every pair.
	Tags job.Metadata
	// Cursor is a page's NextCursor: the page after it.
	Cursor string
	// Limit is the page size (the server's default, 20, when 0; at most
	// job.ListPageMax).
	Limit int
}

// ListJobs reads a page of the caller's jobs, newest first; NextCursor,
// when set, goes in the next call's JobFilter.Cursor.
func (c *Client) ListJobs(ctx context.Context, f JobFilter) (job.JobPage, error) {
	q := url.Values{}
	if f.Status != "" {
		q.Set("status", string(f.Status))
	}
	if !f.CreatedAfter.IsZero() {
		q.Set("created_after", f.CreatedAfter.UTC().Format(time.RFC3339Nano))
	}
	if !f.CreatedBefore.IsZero() {
		q.Set("created_before", f.CreatedBefore.UTC().Format(time.RFC3339Nano))
	}
	for k, v := range f.Tags {
		q.Add("tag", k+"="+v)
	}
	if f.Cursor != "" {
		q.Set("cursor", f.Cursor)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var page job.JobPage
	err := c.withRetries(ctx, false, func() error {
		page = job.JobPage{}
		_, err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, nil, &page)
		return err
	})
	if err != nil {
		return job.JobPage{}, err
	}
	return page, nil
}

// BatchItem is one job's outcome in a batch, in request order: Submission
// when it was accepted or answered, Err when it was refused.
type BatchItem struct {
	Index      int
	StatusCode int // what the job would have got alone: 200, 202, 4xx, 5xx
	Submission *Submission
	Err        *Error
}

// Batch submits up to 100 jobs in one request. The error is for the request
// as a whole; each job's own error is in its item. Batches carry no
// idempotency key, so they are retried only on 429/502/503/504 answers and
// when the connection was refused (the request surely never arrived).
func (c *Client) Batch(ctx context.Context, specs []job.Spec) ([]BatchItem, error) {
	var out struct {
		Jobs []struct {
			Index  int          `json:"index"`
			Status int          `json:"status"`
			Job    *JobView     `json:"job"`
			Error  *problemJSON `json:"error"`
		} `json:"jobs"`
	}
	if specs == nil {
		specs = []job.Spec{}
	}
	err := c.withRetries(ctx, true, func() error {
		out.Jobs = nil
		_, err := c.do(ctx, http.MethodPost, "/v1/jobs/batch", map[string]any{"jobs": specs}, nil, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	items := make([]BatchItem, len(out.Jobs))
	for i, j := range out.Jobs {
		items[i] = BatchItem{Index: j.Index, StatusCode: j.Status}
		switch {
		case j.Error != nil:
			items[i].Err = j.Error.toError(j.Status)
		case j.Job != nil:
			items[i].Submission = &Submission{JobView: *j.Job, Accepted: j.Status == http.StatusAccepted}
		}
	}
	return items, nil
}

// Runtimes lists the runtimes the worker fleet offers, with image digests
// and the limits policy of each.
func (c *Client) Runtimes(ctx context.Context) ([]job.RuntimeInfo, error) {
	var out struct {
		Runtimes []job.RuntimeInfo `json:"runtimes"`
	}
	err := c.withRetries(ctx, false, func() error {
		_, err := c.do(ctx, http.MethodGet, "/v1/runtimes", nil, nil, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out.Runtimes, nil
}
