package producer

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kilnrun/kiln/job"
)

// eventStreamRetry is the Retry-After of a stream refused by a bound: open
// streams end with their job, or when their reader stalls.
const eventStreamRetry = 5 * time.Second

// streamGate counts the event streams open on this process, per tenant and
// per job, so one tenant's streams cannot take the API's memory and NATS
// consumers from the others.
type streamGate struct {
	mu     sync.Mutex
	tenant map[string]int64
	job    map[string]int64
}

func newStreamGate() *streamGate {
	return &streamGate{tenant: map[string]int64{}, job: map[string]int64{}}
}

// acquire takes a stream of tenant on job id within b, or says which bound
// it is over. release gives it back; call it once.
func (g *streamGate) acquire(tenant, id string, b Bounds) (release func(), over job.Quota, limit int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.tenant[tenant] >= b.EventStreams:
		return nil, job.QuotaEventStreams, b.EventStreams
	case g.job[id] >= b.EventStreamsPerJob:
		return nil, job.QuotaEventStreamsPerJob, b.EventStreamsPerJob
	}
	g.tenant[tenant]++
	g.job[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.tenant[tenant]--; g.tenant[tenant] <= 0 {
				delete(g.tenant, tenant)
			}
			if g.job[id]--; g.job[id] <= 0 {
				delete(g.job, id)
			}
		})
	}, "", 0
}

// open is the number of streams open for tenant.
func (g *streamGate) open(tenant string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tenant[tenant]
}

// streamRefused is the 429 answer to a stream over a bound.
func (e *eventStreams) streamRefused(ctx context.Context, tenant string, q job.Quota, limit int64) *problem {
	detail := fmt.Sprintf("you have %d event streams open, your bound is %d: close one (or read the job's result with GET /v1/jobs/{id}?wait=) and retry after the Retry-After delay", limit, limit)
	if q == job.QuotaEventStreamsPerJob {
		detail = fmt.Sprintf("this job has %d event streams open, the bound per job is %d: close one and retry after the Retry-After delay", limit, limit)
	}
	p := newProblem(http.StatusTooManyRequests, job.ProblemType(job.QuotaProblemType(q)), "Quota exceeded: "+string(q), detail)
	p.Limit = limit
	p.retryAfter = eventStreamRetry
	e.tmetrics.quotaRefused(ctx, tenant, q)
	return p
}
