package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// WaitDrained waits until stream holds no message, failing the test if it
// still holds some after within. For a work-queue stream (jobs, callbacks)
// that means every message was acked or terminated: none is left for
// JetStream to deliver again, which a fixed wait "longer than AckWait" used
// to stand for, known at once.
func WaitDrained(t testing.TB, js jetstream.JetStream, stream string, within time.Duration) {
	t.Helper()
	waitEmpty(t, js, stream, within)
}

// WaitJobsDrained is WaitDrained for the queue of jobs: the tenants'
// backlogs (job.StreamName) and the jobs taken for a worker's slot
// (job.ReadyStreamName), whose messages are acked as their runs end.
func WaitJobsDrained(t testing.TB, js jetstream.JetStream, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	waitEmpty(t, js, job.StreamName, within)
	waitEmpty(t, js, job.ReadyStreamName, max(time.Until(deadline), time.Second))
}

func waitEmpty(t testing.TB, js jetstream.JetStream, stream string, within time.Duration) {
	t.Helper()
	var left uint64
	if !testkit.Poll(within, func() bool {
		s, err := js.Stream(context.Background(), stream)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return false
		}
		left = info.State.Msgs
		return left == 0
	}) {
		t.Fatalf("stream %s still holds %d messages after %v", stream, left, within)
	}
}
