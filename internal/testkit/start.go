package testkit

import (
	"context"
	"sync"
	"testing"
)

// Start runs run (a component's Run: blocks until its context ends) in a
// goroutine and returns stop, which cancels that context and waits for run
// to return, failing the test, naming what, if it returned an error. stop
// is idempotent and also runs at the test's cleanup, so nothing run starts
// outlives the test.
func Start(t testing.TB, what string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
