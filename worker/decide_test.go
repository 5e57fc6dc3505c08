package worker

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	ok := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0)}
	internal := job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "containerd gone")}
	// Exit 125 with a launcher-looking stderr line, as the sandbox judges it.
	programFailed := job.Result{Status: job.StatusFailed, ExitCode: job.IntPtr(125), Error: job.NewFailure(job.CategoryRuntimeError, "the program exited with code 125: kiln-launcher: job frame is not valid")}
	timedOut := job.Result{Status: job.StatusTimedOut, Error: job.NewFailure(job.CategoryTimeout, "10s")}
	cases := []struct {
		name      string
		in        runEnd
		act       action
		status    job.Status // "" = nothing written
		category  job.Category
		retryable bool
	}{
		{"success acks and writes", runEnd{Result: ok, Attempt: 1, MaxDeliver: 3}, actAck, job.StatusSucceeded, "", false},
		{"program failure is terminal, run once", runEnd{Result: programFailed, Attempt: 1, MaxDeliver: 3}, actAck, job.StatusFailed, job.CategoryRuntimeError, false},
		{"timeout is terminal", runEnd{Result: timedOut, Attempt: 1, MaxDeliver: 3}, actAck, job.StatusTimedOut, job.CategoryTimeout, false},
		{"platform error retries", runEnd{Result: internal, Err: errors.New("boom"), Attempt: 1, MaxDeliver: 3}, actNak, "", "", false},
		{"platform error on last attempt terms", runEnd{Result: internal, Err: errors.New("boom"), Attempt: 3, MaxDeliver: 3}, actTerm, job.StatusInternalError, job.CategoryInternal, true},
		{"empty result is a platform error", runEnd{Attempt: 1, MaxDeliver: 3}, actNak, "", "", false},
		{"invalid spec terms", runEnd{Err: fmt.Errorf("run: %w", &job.InvalidError{Field: "code", Message: "empty"}), Attempt: 1, MaxDeliver: 3}, actTerm, job.StatusFailed, job.CategoryInvalidRequest, false},
		{"user cancel writes canceled", runEnd{Result: internal, UserCancel: true, Attempt: 1, MaxDeliver: 3}, actAck, job.StatusCanceled, job.CategoryCanceled, false},
		{"forced drain hands back", runEnd{Result: internal, ForcedDrain: true, Attempt: 3, MaxDeliver: 3}, actNak, "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.in)
			if d.Act != tc.act {
				t.Fatalf("act = %v, want %v (%s)", d.Act, tc.act, d.Reason)
			}
			if tc.status == "" {
				if d.Write != nil {
					t.Fatalf("wrote %+v, want nothing", d.Write)
				}
				return
			}
			if d.Write == nil || d.Write.Status != tc.status {
				t.Fatalf("write = %+v, want status %s", d.Write, tc.status)
			}
			if tc.category != "" && (d.Write.Error == nil || d.Write.Error.Category != tc.category || d.Write.Error.Retryable != tc.retryable) {
				t.Fatalf("error = %+v, want %s retryable=%v", d.Write.Error, tc.category, tc.retryable)
			}
		})
	}
	if d := decide(runEnd{Result: internal, Attempt: 1, MaxDeliver: 3}); d.Delay <= 0 {
		t.Errorf("retry without back-off: %v", d.Delay)
	}
}
