package testkit

import (
	"testing"
	"time"
)

// ReceiveMatching returns the first value from ch that match accepts,
// dropping the others, and fails the test, naming what, if none comes
// within the bound or ch is closed first. For a signal channel shared by
// several jobs or runtimes, where the test waits for one of them.
func ReceiveMatching[T any](t testing.TB, ch <-chan T, within time.Duration, what string, match func(T) bool) T {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case v, ok := <-ch:
			if !ok {
				t.Fatalf("%s: channel closed before a matching value came", what)
			}
			if match(v) {
				return v
			}
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
	}
}
