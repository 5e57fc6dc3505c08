package worker

import (
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
)

// signals turns a worker's Hooks into channels a test receives from. A
// signal nobody receives is dropped once its channel is full, so a busy
// worker is never held up by its test.
type signals struct {
	delivered, held, claimed, recorded, acked, handedBack, terminated, registered chan Event
}

func newSignals() *signals {
	c := func() chan Event { return make(chan Event, 1024) }
	return &signals{delivered: c(), held: c(), claimed: c(), recorded: c(), acked: c(), handedBack: c(), terminated: c(), registered: c()}
}

// hooks are the Config.Hooks that feed s.
func (s *signals) hooks() Hooks {
	to := func(ch chan Event) func(Event) {
		return func(e Event) {
			select {
			case ch <- e:
			default:
			}
		}
	}
	return Hooks{Delivered: to(s.delivered), Held: to(s.held), Claimed: to(s.claimed), Recorded: to(s.recorded),
		Acked: to(s.acked), HandedBack: to(s.handedBack), Terminated: to(s.terminated), Registered: to(s.registered)}
}

// of waits for the signal of job id on ch (skipping other jobs') and returns it.
func of(t *testing.T, ch chan Event, id string, within time.Duration, what string) Event {
	t.Helper()
	return testkit.ReceiveMatching(t, ch, within, what+" of job "+id, func(e Event) bool { return e.JobID == id })
}
