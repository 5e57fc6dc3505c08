package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// outageRuntime is a runtime whose backend can be taken down: then it says
// so to Healthy (signalling each such check on probed) and cannot create
// sandboxes.
type outageRuntime struct {
	testkit.Runtime
	down   atomic.Bool
	probed chan struct{}
}

func (r *outageRuntime) Healthy(context.Context) error {
	if !r.down.Load() {
		return nil
	}
	select {
	case r.probed <- struct{}{}:
	default:
	}
	return errors.New("containerd: connection refused")
}

// While the sandbox backend is down the worker takes no job, holds the one
// whose sandbox it could not create, says so on /readyz and in
// kiln_worker_sandbox_up, and once the backend is back runs every job on
// its first delivery: the outage spent none.
func TestBackendOutageSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2})
	reader := sdkmetric.NewManualReader()
	metrics, err := ktrace.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	rt := &outageRuntime{probed: make(chan struct{})}
	rt.Script = func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		if spec.Code == "first()" && first.CompareAndSwap(false, true) {
			close(started)
			<-release // containerd goes away while the sandbox is being made
		}
		if rt.down.Load() {
			return job.Result{}, createErr{}
		}
		return testkit.Succeed(ctx, id, spec)
	}
	w, err := New(Config{ID: "w-outage", Runtime: rt, Store: b.store, NATS: b.nc, Queue: b.q, Concurrency: 2,
		SandboxProbe: 10 * time.Millisecond, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "Run", w.Run)
	t.Cleanup(func() { rt.down.Store(false) }) // before the stop: the drain must not wait on the outage
	sandboxUp := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == ktrace.MetricSandboxUp && len(g.DataPoints) == 1 {
					return g.DataPoints[0].Value
				}
			}
		}
		return -1
	}

	firstID := b.submit(t, "first()")
	testkit.Closed(t, started, 10*time.Second, "the first job's run")
	rt.down.Store(true)
	close(release)
	// The worker has seen the outage: a second check starts only once the
	// first one's answer is recorded.
	testkit.Receive(t, rt.probed, 10*time.Second, "a probe of the backend")
	testkit.Receive(t, rt.probed, 10*time.Second, "a second probe of the backend")
	others := []string{b.submit(t, "print(2)"), b.submit(t, "print(3)")}
	// Wake the idle slot, as the API does after publishing.
	if err := b.nc.Publish(job.WorkSubject("python"), nil); err != nil {
		t.Fatal(err)
	}
	for range 5 { // five more probes: time enough to take a job, were it to
		testkit.Receive(t, rt.probed, 10*time.Second, "a probe of the backend")
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("runtime called %d times during the outage; want only the first job's failed attempt", n)
	}
	if ackPending, waiting := b.pending(t); ackPending != 1 || waiting != 2 {
		t.Fatalf("consumer: %d delivered and unacked, %d waiting; want 1 (held) and 2", ackPending, waiting)
	}
	ready, checks := w.Readiness(context.Background())
	if ready || !strings.Contains(checks[checkSandbox], "unavailable") {
		t.Fatalf("readiness during the outage: %v %v", ready, checks)
	}
	if up := sandboxUp(); up != 0 {
		t.Fatalf("%s = %d during the outage; want 0", ktrace.MetricSandboxUp, up)
	}

	rt.down.Store(false)
	for _, id := range append([]string{firstID}, others...) {
		rec := b.waitTerminal(t, id, 10*time.Second)
		if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 1 {
			t.Fatalf("job %s: %s on attempt %d; want succeeded on its first delivery", id, rec.Status, rec.Result.Attempt)
		}
	}
	if ready, checks := w.Readiness(context.Background()); !ready {
		t.Fatalf("readiness after the outage: %v", checks)
	}
	if up := sandboxUp(); up != 1 {
		t.Fatalf("%s = %d after the outage; want 1", ktrace.MetricSandboxUp, up)
	}
}

// uncheckedRuntime is a backend without a health check: it says so to
// every Healthy, counted.
type uncheckedRuntime struct {
	testkit.Runtime
	asked atomic.Int32
}

func (r *uncheckedRuntime) Healthy(context.Context) error {
	r.asked.Add(1)
	return fmt.Errorf("no health service: %w", errors.ErrUnsupported)
}

// A backend whose health check is unsupported is asked once: the worker
// then neither probes it nor reports it in its readiness, and runs jobs.
func TestBackendWithoutAHealthCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	rt := &uncheckedRuntime{Runtime: testkit.Runtime{Script: testkit.Succeed}}
	w, err := New(Config{ID: "w-unchecked", Runtime: rt, Store: b.store, NATS: b.nc, Queue: b.q, Concurrency: 2,
		SandboxProbe: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "Run", w.Run)
	for _, code := range []string{"print(1)", "print(2)"} {
		id := b.submit(t, code)
		if rec := b.waitTerminal(t, id, 10*time.Second); rec.Status != job.StatusSucceeded {
			t.Fatalf("job %s: %s; want succeeded", id, rec.Status)
		}
	}
	if n := rt.asked.Load(); n != 1 {
		t.Errorf("Healthy asked %d times; want once, at start", n)
	}
	if _, checks := w.Readiness(context.Background()); checks[checkSandbox] != "" {
		t.Errorf("readiness reports the sandbox (%q) of a backend without a health check: %v", checks[checkSandbox], checks)
	}
}

// A JetStream store that refuses writes fails the worker's /readyz; it is
// ready again once writes succeed. The probe stream is made to refuse
// writes the way a full store does.
func TestReadinessFollowsJetStreamWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	w, err := New(Config{ID: "w-writes", Runtime: &testkit.Runtime{Script: testkit.Succeed}, Store: b.store, NATS: b.nc, Queue: b.q,
		Concurrency: 1, WriteProbe: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Start(t, "Run", w.Run)
	await := func(want bool) map[string]string {
		t.Helper()
		var ready bool
		var checks map[string]string
		if !testkit.Poll(5*time.Second, func() bool {
			ready, checks = w.Readiness(context.Background())
			return ready == want && (want || strings.Contains(checks[checkWrites], "unavailable"))
		}) {
			t.Fatalf("readiness %v %v; want ready=%v", ready, checks, want)
		}
		return checks
	}
	await(true)
	st, err := b.js.Stream(context.Background(), queue.ProbeStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	full := cfg
	full.MaxBytes, full.MaxMsgs, full.Discard = 1, 1, jetstream.DiscardNew
	if _, err := b.js.UpdateStream(context.Background(), full); err != nil {
		t.Fatal(err)
	}
	t.Logf("store refusing writes: %v", await(false)[checkWrites])
	if _, err := b.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	await(true)
}
