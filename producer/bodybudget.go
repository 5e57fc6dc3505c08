package producer

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/kilnrun/kiln/job"
)

// bodyBudget bounds the bytes of request bodies held at once. A request
// reserves its Content-Length (or MaxBodyBytes when the length is unknown)
// before reading the body and keeps it until its answer is written, because
// the decoded spec, the job message and the Redis and NATS writes hold
// copies of the body until then. A request that cannot reserve within
// BodyWait is answered 503 with Retry-After and reads nothing.
type bodyBudget struct {
	sem        *semaphore.Weighted
	total      int64
	wait       time.Duration
	maxBody    int64         // Config.MaxBodyBytes, one body's bound
	retryAfter time.Duration // Config.RetryAfter
}

func newBodyBudget(cfg Config) *bodyBudget {
	return &bodyBudget{sem: semaphore.NewWeighted(cfg.MaxBodyBytesInFlight), total: cfg.MaxBodyBytesInFlight, wait: cfg.BodyWait,
		maxBody: cfg.MaxBodyBytes, retryAfter: cfg.RetryAfter}
}

// reserve takes the request's share of the budget; release gives it back.
func (b *bodyBudget) reserve(ctx context.Context, r *http.Request) (release func(), p *problem) {
	n := r.ContentLength
	if n > b.maxBody {
		return func() {}, nil // readBody answers 413, discarding the body without holding it
	}
	if n < 0 {
		n = b.maxBody // unknown length (chunked): assume the worst
	}
	n = max(n, 1)
	release = func() { b.sem.Release(n) }
	if b.sem.TryAcquire(n) {
		return release, nil // the budget has room: no timer to set
	}
	wctx, cancel := context.WithTimeout(ctx, b.wait)
	defer cancel()
	if err := b.sem.Acquire(wctx, n); err != nil {
		p := newProblem(http.StatusServiceUnavailable, job.ProblemBusy, "Server busy",
			fmt.Sprintf("request bodies in flight already hold the server's budget of %d bytes; nothing was read, retry after the Retry-After delay", b.total))
		p.retryAfter = b.retryAfter
		return nil, p
	}
	return release, nil
}
