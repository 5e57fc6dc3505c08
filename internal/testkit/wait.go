package testkit

import (
	"testing"
	"time"
)

// pollFloor and pollCeil bound Eventually's back-off between checks: quick
// at first, so a condition that holds at once costs nothing, then no more
// than pollCeil, so a slow dependency is not hammered.
const (
	pollFloor = time.Millisecond
	pollCeil  = 50 * time.Millisecond
)

// Eventually checks cond until it holds and fails the test, naming what, if
// it does not hold within the bound. It is for state a real dependency
// holds and announces to no one; prefer a signal (Receive, Closed) where the
// code under test gives one.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// Poll checks cond until it holds or within passes, and reports whether it
// held. For tests that assert something does *not* happen within a bound,
// or that must clean up before failing.
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	wait := pollFloor
	for {
		if cond() {
			return true
		}
		tick := time.NewTimer(wait)
		select {
		case <-deadline.C:
			tick.Stop()
			return cond()
		case <-tick.C:
		}
		if wait *= 2; wait > pollCeil {
			wait = pollCeil
		}
	}
}

// Receive returns the next value from ch, failing the test if none comes
// within the bound or ch is closed first.
func Receive[T any](t testing.TB, ch <-chan T, within time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed before a value came", what)
		}
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
	panic("unreachable")
}

// Closed waits for ch to be closed (or to deliver), failing the test if it
// is not within the bound.
func Closed[T any](t testing.TB, ch <-chan T, within time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// Quiet fails the test if ch delivers (or is closed) within d: the bounded
// wait a test uses to show that something did not happen.
func Quiet[T any](t testing.TB, ch <-chan T, d time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		t.Fatalf("%s happened within %v; it should not have", what, d)
	case <-timer.C:
	}
}
