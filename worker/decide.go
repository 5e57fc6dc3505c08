package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/job"
)

// action is what happens to the JetStream message once a delivery is handled.
type action int

const (
	actAck  action = iota // done: a terminal result was written (or already existed)
	actNak                // give the job back for another delivery, after Delay
	actTerm               // never deliver again; a terminal result was written
)

func (a action) String() string {
	return [...]string{"ack", "nak", "term"}[a]
}

// decision is the single answer to "what now?" for one delivery.
type decision struct {
	Act    action
	Delay  time.Duration // for actNak
	Write  *job.Result   // terminal result to record before acking; nil: write nothing
	Reason string        // for logs and TermWithReason
}

// runEnd is how one delivery's run ended: everything decide needs to know.
type runEnd struct {
	Result      job.Result
	Err         error // from Sandboxes.Run
	Attempt     int
	MaxDeliver  int
	UserCancel  bool // the client asked for the job to be cancelled
	ForcedDrain bool // the worker is stopping and its grace period ran out
}

// retryDelay is the back-off before a platform-failed job is tried again.
func retryDelay(attempt int) time.Duration {
	d := time.Second << min(attempt, 5)
	return min(d, 30*time.Second)
}

// decide maps a run's end to an action. It is the only place where the
// worker chooses between ack, nak and term.
func decide(o runEnd) decision {
	res := o.Result
	var invalid *job.InvalidError
	switch {
	case o.ForcedDrain:
		// The worker stopped the job itself; it is not the job's fault.
		// Another worker runs it from the start.
		return decision{Act: actNak, Reason: "worker shutting down; job handed back"}
	case o.UserCancel:
		res.Status = job.StatusCanceled
		res.Error = job.NewFailure(job.CategoryCanceled, "canceled by request")
		return decision{Act: actAck, Write: &res, Reason: "canceled"}
	case errors.As(o.Err, &invalid):
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, invalid.Error())
		return decision{Act: actTerm, Write: &res, Reason: "invalid job"}
	case o.Err != nil || res.Status == job.StatusInternalError || res.Status == "":
		msg := "sandbox failed"
		if o.Err != nil {
			msg = o.Err.Error()
		} else if res.Error != nil {
			msg = res.Error.Message
		}
		if o.Attempt < o.MaxDeliver {
			return decision{Act: actNak, Delay: retryDelay(o.Attempt), Reason: "platform error, retrying: " + msg}
		}
		res.Status = job.StatusInternalError
		res.Error = job.NewFailure(job.CategoryInternal, fmt.Sprintf("gave up after %d attempts: %s", o.Attempt, msg))
		return decision{Act: actTerm, Write: &res, Reason: "platform error, attempts exhausted"}
	default:
		return decision{Act: actAck, Write: &res, Reason: string(res.Status)}
	}
}
