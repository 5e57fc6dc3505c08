package cache

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Record is a job's stored state: what was submitted, where it is in its life
// and, once terminal, its result.
type Record struct {
	// Message is the job as published: id, resolved spec, cache key, created_at, trace_id.
	Message job.Message
	// Status is where the job is; a terminal status never changes again.
	Status job.Status
	// Attempt is the delivery attempt of the latest MarkRunning (0 while queued).
	Attempt int
	// Worker is the id of the worker that last marked the job running.
	Worker string
	// StartedAt is when the latest attempt started; nil while queued.
	StartedAt *time.Time
	// FinishedAt is when the job became terminal; nil before.
	FinishedAt *time.Time
	// Result is set once the job is terminal.
	Result *job.Result
	// CancelRequested is set when Cancel found the job running; the worker
	// running it should stop it and Finish with StatusCanceled.
	CancelRequested bool
	// Published is set once JetStream acknowledged the job's message
	// (MarkPublished); a queued job without it may never have been queued.
	Published bool
	// CacheHit marks a record made by CreateAlias for a submission answered
	// from the result cache.
	CacheHit bool
	// Callback is the callback delivery state (SetCallback); nil before the
	// first attempt or when the job names no callback_url.
	Callback *job.CallbackState
}

// Fields of the job record hash. The Lua scripts in scripts.go use the same
// literal names.
const (
	fieldMsg         = "msg"          // job.Message JSON
	fieldStatus      = "status"       // job.Status
	fieldAttempt     = "attempt"      // decimal
	fieldWorker      = "worker"       // worker id
	fieldStartedAt   = "started_at"   // RFC 3339, UTC, nanoseconds
	fieldFinishedAt  = "finished_at"  // RFC 3339, UTC, nanoseconds
	fieldResult      = "result"       // job.Result, stored form (resultcodec.go)
	fieldResultCopy  = "result_copy"  // instead of result: the SHA-256 naming the hit-result copy that holds it (hittx.go)
	fieldCancel      = "cancel"       // "1" once cancellation was requested
	fieldInflight    = "inflight"     // name of the job's in-flight claim key (keys.go)
	fieldFinishToken = "finish_token" // token of the Finish call that won
	fieldLeaseOwner  = "lease_owner"  // "<worker>/<attempt>" running the job under a lease
	fieldLeaseUntil  = "lease_until"  // server time (unix ms) the lease lapses at
	fieldPublished   = "published"    // "1" once the message was acknowledged by JetStream
	fieldCacheHit    = "cache_hit"    // "1" on a cache-hit record (alias.go)
	fieldConfirmedAt = "confirmed_at" // server time (unix ms) of the latest write made for WAIT (replicated.go)
	fieldIndex       = "index"        // name of the tenant's job index (keys.go's jobIndex), whose status sets the scripts keep
)

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// decodeRecord turns HGETALL output into a Record; an empty map is ErrNotFound.
func decodeRecord(id string, h map[string]string) (*Record, error) {
	if len(h) == 0 {
		return nil, ErrNotFound
	}
	raw, ok := h[fieldMsg]
	if !ok {
		return nil, fmt.Errorf("job %s: record has no message", id)
	}
	r := &Record{Status: job.Status(h[fieldStatus]), Worker: h[fieldWorker], CancelRequested: h[fieldCancel] == "1",
		Published: h[fieldPublished] == "1", CacheHit: h[fieldCacheHit] == "1"}
	if err := json.Unmarshal([]byte(raw), &r.Message); err != nil {
		return nil, fmt.Errorf("job %s: decode message: %w", id, err)
	}
	if v := h[fieldAttempt]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("job %s: decode attempt: %w", id, err)
		}
		r.Attempt = n
	}
	var err error
	if r.StartedAt, err = parseTime(h[fieldStartedAt]); err != nil {
		return nil, fmt.Errorf("job %s: decode started_at: %w", id, err)
	}
	if r.FinishedAt, err = parseTime(h[fieldFinishedAt]); err != nil {
		return nil, fmt.Errorf("job %s: decode finished_at: %w", id, err)
	}
	if r.Callback, err = decodeCallback(h); err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	if v := h[fieldResult]; v != "" {
		res, err := decodeResult([]byte(v))
		if err != nil {
			return nil, fmt.Errorf("job %s: %w", id, err)
		}
		if r.CacheHit {
			// A hit recorded by CreateHitOfKnown or CreateAliasOfKnown
			// holds the cached entry as stored; one recorded by
			// CreateAlias already holds this.
			res = HitOf(res, r.Message.ID, r.Message.TraceID, r.Message.CreatedAt)
		}
		r.Result = &res
	}
	return r, nil
}

func parseTime(v string) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, err
	}
	return &t, nil
}
