package worker

import (
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
)

// A worker serving several runtimes gives its free slot to whichever
// runtime has a job: with one slot and three runtimes, a python job starts
// within the idle poll, never waiting while the slot is held for an empty
// runtime's queue (each runtime used to take a slot and wait 5 s on its own
// queue, so a job could wait 10 s beside a free worker).
func TestOneSlotServesEveryRuntime(t *testing.T) {
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	rt := &testkit.Runtime{Script: testkit.Succeed, Names: []string{"node", "python", "python-slim"}}
	b.start(t, rt, func(c *Config) { c.Concurrency = 1 })
	// Registered: the pull loop starts next and waits on the queues.
	testkit.Eventually(t, 10*time.Second, "the worker to register its runtimes", func() bool { return b.up(t) })
	var worst time.Duration
	for i := range 6 {
		// Each job comes at another point of the idle poll's cycle: that
		// phase, against a real 1 s poll, is what this test samples.
		time.Sleep(time.Duration(i) * idlePoll / 6)
		start := time.Now()
		id := b.submit(t, "print(1)")
		b.waitTerminal(t, id, 20*time.Second)
		took := time.Since(start)
		worst = max(worst, took)
		t.Logf("job %d: %v", i, took.Round(time.Millisecond))
	}
	// Nothing announces these jobs (the API's wake-up is not sent here), so
	// the idle poll (1 s) bounds the wait.
	if worst > idlePoll+time.Second {
		t.Errorf("a python job waited %v beside a free slot", worst)
	}
}
