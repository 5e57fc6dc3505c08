package testenv

import (
	"context"
	"errors"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// SubmitRetrying submits like a well-behaved client: on an answer the
// client calls temporary (429, 503) it waits and tries again. It returns
// the job id and how many times it retried.
func SubmitRetrying(ctx context.Context, c *client.Client, spec job.Spec) (string, int, error) {
	retries := 0
	for {
		sub, err := c.Submit(ctx, spec)
		var ce *client.Error
		if errors.As(err, &ce) && ce.Temporary() {
			retries++
			select {
			case <-ctx.Done():
				return "", retries, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return "", retries, err
		}
		return sub.ID, retries, nil
	}
}
