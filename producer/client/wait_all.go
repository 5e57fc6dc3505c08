package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kilnrun/kiln/job"
)

// WaitAll waits until every job in ids is terminal and returns them in the
// order of ids. It reads the unfinished jobs together (List, 100 at a time)
// and long-polls the first of them in between, so an idle wait costs one
// request per long-poll period. Like Wait it outlasts API restarts; it ends
// with ctx, or with ErrNotFound for an id the API does not know.
func (c *Client) WaitAll(ctx context.Context, ids []string) ([]JobView, error) {
	done := make(map[string]JobView, len(ids))
	for n := 0; ; {
		var pending []string
		for _, id := range ids {
			if _, ok := done[id]; !ok {
				pending = append(pending, id)
			}
		}
		if len(pending) == 0 {
			out := make([]JobView, len(ids))
			for i, id := range ids {
				out[i] = done[id]
			}
			return out, nil
		}
		err := c.pollPending(ctx, pending, done)
		if err == nil {
			n = 0
			continue
		}
		ok, after := retryable(ctx, err, false)
		if !ok {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("kiln client: wait for %d jobs: %w (last error: %w)", len(pending), ctx.Err(), err)
			}
			return nil, err
		}
		if serr := sleep(ctx, c.retry.backoff(n, after)); serr != nil {
			return nil, fmt.Errorf("kiln client: wait for %d jobs: %w (last error: %w)", len(pending), serr, err)
		}
		n++
	}
}

// pollPending records the terminal jobs among pending in done, then
// long-polls the first job still pending. Every request is tried once.
func (c *Client) pollPending(ctx context.Context, pending []string, done map[string]JobView) error {
	one := *c
	one.retry.MaxAttempts = 1
	for start := 0; start < len(pending); start += 100 {
		chunk := pending[start:min(start+100, len(pending))]
		views, err := one.List(ctx, chunk)
		if err != nil {
			return err
		}
		for i, v := range views {
			if v == nil {
				return &Error{Status: http.StatusNotFound, Type: string(job.ProblemNotFound), Title: "Job not found",
					Detail: "no job " + chunk[i]}
			}
			if v.Terminal() {
				done[chunk[i]] = *v
			}
		}
	}
	for _, id := range pending {
		if _, ok := done[id]; !ok {
			_, err := one.Get(ctx, id, longPoll)
			return err
		}
	}
	return nil
}
