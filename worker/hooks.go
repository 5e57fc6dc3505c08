package worker

import (
	"context"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Clock is the time the worker reads for the schedules it keeps against the
// store: when a runtime's registration is due again, how long to wait for a
// worker id held by another process, and how long a sandbox's worker has
// been missing. JetStream's timers (AckWait, the heartbeats that answer it)
// and the store's TTLs run on real time whatever the Clock says.
// testkit.Clock satisfies it.
type Clock interface {
	Now() time.Time
	// After delivers the clock's time once it has moved on by d.
	After(d time.Duration) <-chan time.Time
}

// realClock is the default Clock: the wall clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Event is what a Hooks function is told. The fields a hook does not
// describe are zero.
type Event struct {
	JobID   string
	Attempt int        // the delivery's attempt (its JetStream delivery count)
	Status  job.Status // Recorded: the status written
	Won     bool       // Recorded: whether it became the job's result (first write wins)
	Runtime string     // Registered: the runtime whose registry entry was written
	Err     error      // Registered: why the write failed, nil when it succeeded
}

// Hooks are signals of what the worker does, for tests to wait on instead
// of sleeping. Each is called synchronously where the event happens, so it
// must return quickly; a nil hook is skipped. Default: all nil.
type Hooks struct {
	// Delivered: a delivery of a job came off the queue; its claim is next.
	Delivered func(Event)
	// Held: the delivery found another attempt holding the job's lease and
	// waits for it; called at every check of the lease while it waits.
	Held func(Event)
	// Claimed: the delivery took the job; its run is next.
	Claimed func(Event)
	// Recorded: a terminal result was written for the job, by a delivery or
	// by the give-up on exhausted deliveries (Attempt is the result's).
	Recorded func(Event)
	// Acked: the delivery's message was acked and the server confirmed it,
	// after a recorded result or because the job was terminal already.
	Acked func(Event)
	// HandedBack: the delivery's message was given back (nak) for another
	// delivery.
	HandedBack func(Event)
	// Terminated: the delivery's message was terminated (never delivered
	// again): its record is gone, or the job is invalid or out of attempts.
	Terminated func(Event)
	// Registered: the worker wrote (or failed to write) a runtime's entry
	// in the runtime registry.
	Registered func(Event)
}

// fire calls hook with e, if it is set.
func fire(hook func(Event), e Event) {
	if hook != nil {
		hook(e)
	}
}

// sleepOn waits d on clock or until ctx ends; it reports whether ctx is
// still live.
func sleepOn(ctx context.Context, clock Clock, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-clock.After(d):
		return true
	}
}
