package cache_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// A job's life as producer and worker see it. (Compiled, not run: it needs a
// redis-server.)
func Example() {
	ctx := context.Background()
	store, err := cache.New(ctx, cache.Config{URL: "redis://127.0.0.1:6379/0"})
	if err != nil {
		fmt.Println(err) // names the address; errors.Is(err, cache.ErrUnavailable)
		return
	}
	defer store.Close()

	// Producer: answer from the result cache, or record the job.
	spec := job.Spec{Runtime: "python", Code: "print(6*7)", Limits: job.DefaultLimits}
	msg := job.Message{ID: job.NewID(), Spec: spec, Key: job.Key(spec, "sha256:..."), CreatedAt: time.Now()}
	if res, ok, err := store.LookupResult(ctx, msg.Key); err == nil && ok {
		fmt.Println("cache hit:", res.Stdout)
		return
	}
	if err := store.CreateJob(ctx, msg); errors.Is(err, cache.ErrUnavailable) {
		fmt.Println("answer 503:", err)
		return
	}

	// Worker: claim the job, run it, and store the first terminal result.
	st, err := store.MarkRunningLeased(ctx, msg.ID, "worker-1", 1, time.Now(), cache.Lease{Token: "worker-1/1"})
	if err != nil || st != job.StatusRunning {
		return // canceled meanwhile, or finished by an earlier delivery
	}
	res := job.Result{ID: msg.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "42\n"}
	if won, err := store.Finish(ctx, msg.ID, res); err == nil && won {
		_ = store.StoreResult(ctx, msg.Key, res) // stores only cacheable outcomes
	}
}
