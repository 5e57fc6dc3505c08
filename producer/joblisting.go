package producer

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// JobLister is the part of cache.Store GET /v1/jobs lists with (without
// ?ids=); a Store without it answers 501 there.
type JobLister interface {
	ListJobs(ctx context.Context, q cache.JobQuery) ([]*cache.Record, string, error)
}

// listingParams are the query parameters of a listing; GET /v1/jobs with
// any other (but ids) is refused, so a misspelt filter never lists
// everything.
var listingParams = map[string]bool{"status": true, "created_after": true, "created_before": true, "tag": true, "cursor": true, "limit": true}

// parseJobQuery reads a listing's query parameters.
func parseJobQuery(v url.Values) (cache.JobQuery, *problem) {
	q := cache.JobQuery{Limit: job.ListPageDefault}
	for name := range v {
		if !listingParams[name] {
			return q, badParam(name, fmt.Sprintf("%s is not a parameter of GET /v1/jobs: filter with status, created_after, created_before and tag=KEY=VALUE; page with cursor and limit (or read jobs by id with ids=)", name))
		}
	}
	if st := v.Get("status"); st != "" {
		if !slices.Contains(job.Statuses, job.Status(st)) {
			return q, badParam("status", fmt.Sprintf("status %q is not a job status: one of %v", st, job.Statuses))
		}
		q.Status = job.Status(st)
	}
	for _, name := range []string{"created_after", "created_before"} {
		raw := v.Get(name)
		if raw == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, raw)
		if err != nil {
			return q, badParam(name, fmt.Sprintf("%s %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", name, raw))
		}
		if name == "created_after" {
			q.After = t
		} else {
			q.Before = t
		}
	}
	tags, p := tagsOf(v)
	if p != nil {
		return q, p
	}
	q.Tags = tags
	if c := v.Get("cursor"); c != "" {
		if !job.ValidID(c) {
			return q, badParam("cursor", "cursor is not one this API gave: pass a page's next_cursor as it is")
		}
		q.Cursor = c
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > job.ListPageMax {
			p := badParam("limit", fmt.Sprintf("limit %q must be 1 .. %d", l, job.ListPageMax))
			p.Limit = job.ListPageMax
			return q, p
		}
		q.Limit = n
	}
	return q, nil
}

// parseTags reads a listing's ?tag=KEY=VALUE filters (sessions too).
func parseTags(r *http.Request) (job.Metadata, *problem) { return tagsOf(r.URL.Query()) }

func tagsOf(v url.Values) (job.Metadata, *problem) {
	raw := v["tag"]
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) > job.MaxMetadataKeys {
		p := badParam("tag", fmt.Sprintf("%d tags; at most %d", len(raw), job.MaxMetadataKeys))
		p.Limit = job.MaxMetadataKeys
		return nil, p
	}
	tags := job.Metadata{}
	for _, t := range raw {
		k, val, err := job.ParseTag(t)
		if err != nil {
			return nil, badParam("tag", err.Error())
		}
		if prev, dup := tags[k]; dup && prev != val {
			return nil, badParam("tag", fmt.Sprintf("tag %s is asked twice with different values (%q, %q): no job matches both", k, prev, val))
		}
		tags[k] = val
	}
	return tags, nil
}

// jobSummary is rec as a listing shows it.
func jobSummary(rec *cache.Record) job.JobSummary {
	m := rec.Message
	l := jobLinks(m.ID)
	sum := job.JobSummary{ID: m.ID, Status: rec.Status, Runtime: m.Spec.Runtime, CreatedAt: m.CreatedAt.UTC(),
		StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt, CacheHit: rec.CacheHit, Metadata: m.Spec.Metadata,
		ReplayOf: m.ReplayOf, Links: job.JobLinks{Self: l.Self, Wait: l.Wait}}
	if res := rec.Result; res != nil {
		sum.ExitCode = res.ExitCode
		if res.Error != nil {
			f := *res.Error
			f.Exception = nil
			sum.Error = &f
		}
		if sum.FinishedAt == nil {
			sum.FinishedAt = res.FinishedAt
		}
	}
	if rec.CacheHit {
		sum.StartedAt = nil
	}
	return sum
}

// handleJobListing answers GET /v1/jobs without ?ids=: a page of the
// caller's jobs, newest first, filtered by status, creation time and
// metadata (tag=KEY=VALUE, every one must hold), from cursor on.
func (jr *jobRoutes) handleJobListing(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	lister, ok := jr.store.(JobLister)
	if !ok {
		writeProblem(w, newProblem(http.StatusNotImplemented, job.ProblemInternal, "Listing unavailable", "this API's store does not list jobs"))
		return
	}
	q, p := parseJobQuery(r.URL.Query())
	if p != nil {
		writeProblem(w, p)
		return
	}
	q.Tenant = caller
	recs, next, err := lister.ListJobs(ctx, q)
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "list jobs", err))
		return
	}
	page := job.JobPage{Jobs: make([]job.JobSummary, 0, len(recs)), NextCursor: next}
	for _, rec := range recs {
		page.Jobs = append(page.Jobs, jobSummary(rec))
	}
	writeJSON(w, http.StatusOK, page)
}
