package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/job"
)

// RestoreJob re-creates the queued record of a job from its queue message,
// for a worker that finds the record gone while the message is still in the
// stream: the record was lost (Redis restarted without its data, or failed
// over to a replica that had not received it yet). It reports false, and
// writes nothing, when the record's lifetime (JobTTL from CreatedAt) is
// over: then the record expired and the job must not run. The restored
// record keeps the original expiry. An existing record is left as it is.
func (s *Jobs) RestoreJob(ctx context.Context, msg job.Message, now time.Time) (bool, error) {
	op := "restore job " + msg.ID
	left := msg.CreatedAt.Add(time.Duration(s.jobTTL) * time.Millisecond).Sub(now)
	if msg.CreatedAt.IsZero() || left < time.Millisecond {
		return false, nil
	}
	raw, err := json.Marshal(msg)
	if err != nil {
		return false, fmt.Errorf("%s: encode message: %w", op, err)
	}
	if _, err := s.runCreateJob(ctx, msg, raw, left.Milliseconds(), false); err != nil {
		return false, fail(op, err)
	}
	return true, nil
}
