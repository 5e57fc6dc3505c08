package testkit

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPollSeesAConditionThatComesTrue(t *testing.T) {
	var n atomic.Int32
	if !Poll(time.Second, func() bool { return n.Add(1) >= 5 }) {
		t.Fatal("Poll gave up on a condition that held on the fifth check")
	}
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
}

func TestReceiveAndClosed(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Receive(t, ch, time.Second, "a value"); got != 7 {
		t.Fatalf("Receive = %d, want 7", got)
	}
	done := make(chan struct{})
	close(done)
	Closed(t, done, time.Second, "done")
	Quiet(t, make(chan struct{}), time.Millisecond, "nothing")
}

func TestClockFiresTimersWhenAdvanced(t *testing.T) {
	c := NewClock(time.Time{})
	start := c.Now()
	a := c.After(time.Minute)
	b := c.After(time.Hour)
	c.Advance(30 * time.Second)
	select {
	case <-a:
		t.Fatal("a one-minute timer fired after 30 s")
	default:
	}
	c.Advance(31 * time.Second)
	if got := <-a; got.Sub(start) != 61*time.Second {
		t.Fatalf("timer fired at +%v, want +61s", got.Sub(start))
	}
	select {
	case <-b:
		t.Fatal("an hour timer fired after 61 s")
	default:
	}
	c.Set(start) // never backwards
	if c.Since(start) != 61*time.Second {
		t.Fatalf("Set moved the clock backwards: %v", c.Since(start))
	}
}
