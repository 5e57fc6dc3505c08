package producer

import (
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// links are the URLs a client follows next.
type links struct {
	Self string `json:"self"`
	Wait string `json:"wait"`
}

func jobLinks(id string) *links {
	self := "/v1/jobs/" + id
	return &links{Self: self, Wait: self + "?wait=30s"}
}

// pendingView describes a job that is not terminal (or, in a 202 answer to
// a submission, one just accepted).
type pendingView struct {
	ID              string     `json:"id"`
	Status          job.Status `json:"status"`
	CreatedAt       *time.Time `json:"created_at,omitempty"`
	StartedAt       *time.Time `json:"started_at,omitempty"`
	Attempt         int        `json:"attempt,omitempty"`
	Worker          string     `json:"worker,omitempty"`
	TraceID         string     `json:"trace_id,omitempty"`
	CancelRequested bool       `json:"cancel_requested,omitempty"`
	// Callback is where the job's callback stands, when it names a callback_url.
	Callback *job.CallbackState `json:"callback,omitempty"`
	Metadata job.Metadata       `json:"metadata,omitempty"`
	Links    *links             `json:"links"`
}

// resultView is a terminal job: its Result with the pipeline fields filled
// from the record.
type resultView struct {
	job.Result
	Callback *job.CallbackState `json:"callback,omitempty"`
	// Metadata is the job's, as its submission sent it (never the cache
	// entry's).
	Metadata job.Metadata `json:"metadata,omitempty"`
	Links    *links       `json:"links,omitempty"`
	// tmpl, when set, is the template the view's JSON answer is made from
	// (cachehit.go) when writeBody sends it. Set only on a view nothing
	// changes afterwards.
	tmpl *hitTemplate
}

// recordView returns the JSON body for rec and whether the job is terminal.
func recordView(rec *cache.Record) (any, bool) {
	m := rec.Message
	created := m.CreatedAt
	if rec.Status.Terminal() && rec.Result == nil {
		// Every terminal write stores a Result; should one be missing, the
		// job still reads as a Result (the documented shape of a finished job).
		rec.Result = &job.Result{Status: rec.Status, Error: job.NewFailure(job.CategoryInternal, "the job ended without a recorded result")}
	}
	if !rec.Status.Terminal() {
		return &pendingView{
			ID: m.ID, Status: rec.Status, CreatedAt: &created, StartedAt: rec.StartedAt,
			Attempt: rec.Attempt, Worker: rec.Worker, TraceID: m.TraceID,
			CancelRequested: rec.CancelRequested, Callback: callbackView(m, rec.Callback), Metadata: m.Spec.Metadata,
			Links: jobLinks(m.ID),
		}, rec.Status.Terminal()
	}
	r := *rec.Result
	r.ID = m.ID
	r.Status = rec.Status
	r.CreatedAt = &created
	if r.StartedAt == nil {
		r.StartedAt = rec.StartedAt
	}
	if r.FinishedAt == nil {
		r.FinishedAt = rec.FinishedAt
	}
	if r.Attempt == 0 {
		r.Attempt = rec.Attempt
	}
	if r.Worker == "" {
		r.Worker = rec.Worker
	}
	if r.TraceID == "" {
		r.TraceID = m.TraceID
	}
	if r.QueueMS == 0 && r.StartedAt != nil {
		r.QueueMS = max(r.StartedAt.Sub(created).Milliseconds(), 0)
	}
	return &resultView{Result: r, Callback: callbackView(m, rec.Callback), Metadata: m.Spec.Metadata, Links: jobLinks(m.ID)}, true
}

// cacheHitView is the answer to a submission found in the result cache
// (cache.HitOf): the cached outcome under the new id, with the
// submission's metadata.
func cacheHitView(res job.Result, id, traceID string, now time.Time, md job.Metadata) *resultView {
	return &resultView{Result: cache.HitOf(res, id, traceID, now), Metadata: md}
}
