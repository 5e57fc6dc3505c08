package producer

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

func TestEffectivePolicyIsTheStricterOfServerAndRuntime(t *testing.T) {
	t.Parallel()
	server := job.DefaultPolicy()
	rt := job.DefaultPolicy()
	rt.Max.MemoryMB = 128 // below the server default of 256
	rt.Max.Pids = 4096    // above the server max of 1024
	got := effectivePolicy(server, rt)
	if got.Max.MemoryMB != 128 || got.Default.MemoryMB != 128 {
		t.Errorf("memory: default %d max %d, want 128 and 128", got.Default.MemoryMB, got.Max.MemoryMB)
	}
	if got.Max.Pids != server.Max.Pids || got.Default.Pids != server.Default.Pids {
		t.Errorf("pids: default %d max %d, want the server's", got.Default.Pids, got.Max.Pids)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("effective policy invalid: %v", err)
	}
	if effectivePolicy(server, job.Policy{}) != server {
		t.Error("a runtime without a policy did not get the server's")
	}
	if server.Max.MemoryMB != job.MaxLimits.MemoryMB {
		t.Error("effectivePolicy changed its argument")
	}
}

func TestRuntimeDefaultsApplyWithinTheMaximum(t *testing.T) {
	t.Parallel()
	p := job.DefaultPolicy()
	p.Max.MemoryMB = 512
	got := withRuntimeDefaults(p, job.Limits{MemoryMB: 1024, TimeoutMS: 20_000})
	if got.Default.MemoryMB != 512 || got.Default.TimeoutMS != 20_000 || got.Default.Pids != p.Default.Pids {
		t.Fatalf("defaults %+v; want memory 512 (the max), timeout 20000, pids the server's", got.Default)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A registry that empties all at once (Redis lost its data) keeps answering
// with the runtimes it last saw for a short grace, while the workers register
// again; an empty registry past the grace refuses, naming the cause.
func TestRegistryBridgesAStoreThatLostIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.StartRedis(t)
	store, err := cache.New(ctx, cache.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	registerPython(t, store, testDigest)
	clock := testkit.NewClock(time.Time{})
	reg := newRegistry(store, time.Millisecond, job.DefaultPolicy(), clock.Now)
	reg.lossGrace = time.Second
	if _, err := reg.lookup(ctx, "python"); err != nil {
		t.Fatal(err)
	}
	r.RestartEmpty()
	clock.Advance(5 * time.Millisecond) // past the TTL: the next lookup reads the store
	if _, err := reg.lookup(ctx, "python"); err != nil {
		t.Fatalf("right after the store lost the registry: %v", err)
	}
	clock.Advance(reg.lossGrace)
	if _, err := reg.lookup(ctx, "python"); !errors.Is(err, errNoRuntimes) {
		t.Fatalf("past the grace, with no worker registering: %v", err)
	}
}

// With no runtime registered, a submission is not refused as invalid: the
// same request succeeds once a worker registers, so the answer is a 503
// with Retry-After, which clients retry.
func TestEmptyRegistryAnswersRetryLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/jobs", "/v1/jobs/batch"} {
		body := `{"code":"print(1)"}`
		if path == "/v1/jobs/batch" {
			body = `{"jobs":[` + body + `]}`
		}
		r := b.do(t, http.MethodPost, path, body)
		if path == "/v1/jobs/batch" {
			var out struct {
				Jobs []batchItem `json:"jobs"`
			}
			r.decode(t, &out)
			if len(out.Jobs) != 1 || out.Jobs[0].Status != http.StatusServiceUnavailable || out.Jobs[0].Error.Type != job.ProblemUnavailable {
				t.Fatalf("batch: %s", r.body)
			}
			continue
		}
		p := r.problem(t, http.StatusServiceUnavailable)
		if p.Type != string(job.ProblemUnavailable) || p.Field != "runtime" || r.Header.Get("Retry-After") == "" {
			t.Fatalf("submit with no runtime registered: %d %s (Retry-After %q)", r.StatusCode, r.body, r.Header.Get("Retry-After"))
		}
	}
	// Once a worker registers, the retry succeeds (the API re-reads the
	// registry within its cache TTL).
	registerPython(t, b.store, testDigest)
	var r response
	if !testkit.Poll(5*time.Second, func() bool { // as a client honouring Retry-After would, only faster
		r = b.submit(t, `{"code":"print(1)"}`)
		return r.StatusCode != http.StatusServiceUnavailable
	}) || r.StatusCode != http.StatusAccepted {
		t.Fatalf("retry once a runtime is registered: %d %s", r.StatusCode, r.body)
	}
}
