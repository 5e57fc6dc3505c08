package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

type bundle struct {
	redis *testenv.Redis
	store *cache.Store
	nc    *nats.Conn
	js    jetstream.JetStream
	q     queue.Config
}

func setup(t *testing.T, q queue.Config) *bundle {
	t.Helper()
	r := testenv.StartRedis(t)
	b := setupWithStore(t, q, cache.Config{URL: r.URL()})
	b.redis = r
	return b
}

// setupWithStore is setup with a store on the Redis cfg names.
func setupWithStore(t *testing.T, q queue.Config, cfg cache.Config) *bundle {
	t.Helper()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	store, err := cache.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.EnsureStream(ctx, js, q); err != nil {
		t.Fatal(err)
	}
	return &bundle{store: store, nc: nc, js: js, q: q}
}

// submit records and publishes a job the way the producer does.
func (b *bundle) submit(t *testing.T, code string) string {
	t.Helper()
	m := b.record(t, code)
	b.publish(t, m)
	return m.ID
}

// record writes a job's record as the producer does, without publishing it.
func (b *bundle) record(t *testing.T, code string) job.Message {
	t.Helper()
	spec := job.Spec{Runtime: "python", Code: code, Limits: job.DefaultLimits}
	m := job.Message{ID: job.NewID(), Spec: spec, Key: job.Key(spec, "sha256:test"), CreatedAt: time.Now()}
	if err := b.store.CreateJob(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// publish publishes a recorded job's message.
func (b *bundle) publish(t *testing.T, m job.Message) {
	t.Helper()
	ctx := context.Background()
	data, _ := json.Marshal(m)
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: job.JobSubject("python"), Data: data,
		Header: nats.Header{job.HeaderMsgID: []string{m.ID}}}); err != nil {
		t.Fatal(err)
	}
}

// requestRuntime is testkit.Runtime for a test whose script needs the whole
// request (its output sink, its artifact store).
type requestRuntime struct {
	*testkit.Runtime
	run func(ctx context.Context, req sandboxapi.Request) (job.Result, error)
}

func (r *requestRuntime) Run(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
	r.Calls.Add(1)
	return r.run(ctx, req)
}

func (b *bundle) start(t *testing.T, rt Sandboxes, mod func(*Config)) (stop func()) {
	t.Helper()
	cfg := Config{ID: "w-" + t.Name(), Runtime: rt, Store: b.store, NATS: b.nc, Queue: b.q, Concurrency: 2}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testkit.Start(t, "worker.Run", w.Run)
}

// waitTerminal waits for the job's completion notice (the worker sends it
// once the result is recorded, cached and settled against quotas and
// budgets) and returns the job's record. A job whose record is terminal
// already is not waited for.
func (b *bundle) waitTerminal(t *testing.T, id string, within time.Duration) cache.Record {
	t.Helper()
	notices := make(chan *nats.Msg, 4)
	sub, err := b.nc.ChanSubscribe(job.DoneSubject(id), notices)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	rec, err := b.store.GetJob(context.Background(), id)
	if err != nil || !rec.Status.Terminal() {
		testkit.Receive(t, notices, within, "the completion notice of job "+id)
		rec, err = b.store.GetJob(context.Background(), id)
	}
	if err != nil || !rec.Status.Terminal() {
		t.Fatalf("job %s after its completion notice: status %q, err %v", id, rec.Status, err)
	}
	return rec
}

// up reports whether a worker has finished starting: it registers its
// runtimes right before it starts taking jobs. (Workers take jobs in fair
// turns without keeping a pull request open, so the consumer's waiting
// count says nothing.)
func (b *bundle) up(t *testing.T) bool {
	t.Helper()
	rts, err := b.store.Runtimes(context.Background())
	return err == nil && len(rts) > 0
}

// pending is what the queue holds of python's jobs: delivered and not yet
// acked, and waiting (in a backlog, or in the ready stream undelivered).
func (b *bundle) pending(t *testing.T) (ackPending, waiting uint64) {
	t.Helper()
	jobs, err := b.js.Stream(context.Background(), job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	backlog, err := queue.Backlog(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := b.js.Consumer(context.Background(), job.ReadyStreamName, queue.RunConsumerName("python", 0))
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, backlog["python"] // no worker has made it yet
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return uint64(info.NumAckPending), info.NumPending + backlog["python"]
}

// A job is claimed, run, recorded and acked, in that order, once: the
// result is the job's record and the cache's, and the queue holds nothing.
func TestRunsJobAndAcks(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	rt := &testkit.Runtime{Script: testkit.Succeed}
	sig := newSignals()
	b.start(t, rt, func(c *Config) { c.Hooks = sig.hooks() })
	id := b.submit(t, "print(1)")
	if e := of(t, sig.claimed, id, 10*time.Second, "the claim"); e.Attempt != 1 {
		t.Fatalf("claimed on attempt %d, want 1", e.Attempt)
	}
	if e := of(t, sig.recorded, id, 10*time.Second, "the recorded result"); e.Status != job.StatusSucceeded || !e.Won || e.Attempt != 1 {
		t.Fatalf("recorded %+v; want succeeded, won, attempt 1", e)
	}
	of(t, sig.acked, id, 10*time.Second, "the ack")
	if a, p := b.pending(t); a != 0 || p != 0 {
		t.Fatalf("after the ack: %d unacked, %d pending", a, p)
	}
	rec := b.waitTerminal(t, id, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result == nil || rec.Result.Attempt != 1 || rec.Result.Worker != "w-"+t.Name() {
		t.Fatalf("record = %+v result %+v", rec, rec.Result)
	}
	// The result is in the cache under the key of the digest that ran.
	got, ok, err := b.store.LookupResult(context.Background(), job.Key(rec.Message.Spec, "sha256:test"))
	if err != nil || !ok || got.Stdout != "ok\n" {
		t.Fatalf("cache lookup: ok=%v err=%v res=%+v", ok, err, got)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("runtime called %d times, want 1", n)
	}
	// The runtime registry carries the digest for producers.
	rts, err := b.store.Runtimes(context.Background())
	if err != nil || len(rts) != 1 || rts[0].Digest != "sha256:test" {
		t.Fatalf("runtimes = %+v, %v", rts, err)
	}
}

// A job whose deliveries all end without a result (here: the worker never
// answers within AckWait) is recorded as internal_error by the advisory
// watcher; the late runs that finish afterwards do not overwrite it.
func TestExhaustedDeliveriesBecomeInternalError(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 500 * time.Millisecond, MaxDeliver: 2})
	release := make(chan struct{})
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		select { // a wedged run: heartbeats are off, so JetStream redelivers
		case <-release:
		case <-ctx.Done():
		}
		return testkit.Succeed(ctx, id, spec)
	}}
	// A third slot keeps a pull request open: JetStream notices exhausted
	// deliveries only when it tries to deliver again.
	sig := newSignals()
	b.start(t, rt, func(c *Config) {
		c.Heartbeat = time.Hour
		c.DrainTimeout = time.Second
		c.Concurrency = 3
		c.Hooks = sig.hooks()
	})
	var once sync.Once
	unwedge := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unwedge) // runs before the worker's stop, so a failure cannot hang the drain
	id := b.submit(t, "wedge()")
	rec := b.waitTerminal(t, id, 20*time.Second)
	if rec.Status != job.StatusInternalError || rec.Result.Error == nil || !rec.Result.Error.Retryable ||
		!strings.Contains(rec.Result.Error.Message, "delivered 2 times") {
		t.Fatalf("record %+v result %+v", rec, rec.Result)
	}
	if n := rt.Calls.Load(); n != 2 {
		t.Errorf("runtime called %d times, want 2 (one per delivery)", n)
	}
	unwedge()
	// Both wedged runs write their (losing) results.
	for range 2 {
		e := testkit.ReceiveMatching(t, sig.recorded, 10*time.Second, "a wedged run's write", func(e Event) bool {
			return e.JobID == id && e.Status == job.StatusSucceeded
		})
		if e.Won {
			t.Fatalf("a late run's result (attempt %d) replaced the recorded internal_error", e.Attempt)
		}
	}
	again, err := b.store.GetJob(context.Background(), id)
	if err != nil || again.Status != job.StatusInternalError {
		t.Fatalf("terminal record changed: %+v %v", again, err)
	}
}

// A second delivery of a job that is running right now (here a duplicate
// message; in production a redelivery after the queue lost the running
// worker's heartbeats) is held, not run: the lease in the store says the
// first attempt is alive. When that attempt finishes, the duplicate is acked.
func TestDuplicateDeliveryWaitsForRunningAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return testkit.Succeed(ctx, id, spec)
	}}
	// One worker with spare slots: both deliveries land on it, so the lease
	// must tell deliveries apart, not just workers.
	sig := newSignals()
	b.start(t, rt, func(c *Config) { c.Concurrency = 3; c.Heartbeat = 100 * time.Millisecond; c.Hooks = sig.hooks() })
	var once sync.Once
	unwedge := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unwedge) // runs before the worker's stop, so a failure cannot hang the drain
	id := b.submit(t, "long_job()")
	testkit.Receive(t, started, 10*time.Second, "the first attempt's run")
	rec, err := b.store.GetJob(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(rec.Message)
	if _, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: job.JobSubject("python"), Data: data,
		Header: nats.Header{job.HeaderMsgID: []string{id + "-duplicate"}}}); err != nil {
		t.Fatal(err)
	}
	// Several lease polls and heartbeats pass; the duplicate must stay held.
	for range 5 {
		of(t, sig.held, id, 10*time.Second, "the duplicate's check of the lease")
	}
	if a, _ := b.pending(t); a != 2 {
		t.Fatalf("%d deliveries unacked, want both held", a)
	}
	select {
	case <-started:
		t.Fatal("the duplicate delivery ran the job while its first attempt was running")
	default:
	}
	unwedge()
	rec = b.waitTerminal(t, id, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 1 {
		t.Fatalf("record %+v result %+v", rec, rec.Result)
	}
	of(t, sig.acked, id, 10*time.Second, "one delivery's ack")
	of(t, sig.acked, id, 10*time.Second, "the other delivery's ack")
	if a, p := b.pending(t); a != 0 || p != 0 {
		t.Fatalf("after both acks: %d unacked, %d pending", a, p)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("runtime called %d times, want 1", n)
	}
}

// With Redis down the worker holds the job (no ack, no nak, heartbeats on)
// and finishes it when Redis is back; nothing is lost.
func TestStoreOutageHoldsJob(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	b := setup(t, queue.Config{AckWait: ackWait})
	rt := &testkit.Runtime{Script: testkit.Succeed}
	sig := newSignals()
	b.start(t, rt, func(c *Config) { c.Heartbeat = ackWait / 4; c.Hooks = sig.hooks() })
	testkit.Eventually(t, 10*time.Second, "the worker to register", func() bool { return b.up(t) }) // the worker is up and pulling
	m := b.record(t, "print(2)")
	id := m.ID
	b.redis.Stop()
	b.publish(t, m)
	of(t, sig.delivered, id, 10*time.Second, "the delivery")
	// Two AckWaits: heartbeats must keep it from redelivery.
	testkit.Quiet(t, sig.delivered, 2*ackWait, "a redelivery while the store was down")
	if n := rt.Calls.Load(); n != 0 {
		t.Fatalf("ran %d times with the store down, want 0", n)
	}
	b.redis.Start()
	rec := b.waitTerminal(t, id, 15*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 1 {
		t.Fatalf("record %+v result %+v", rec, rec.Result)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("ran %d times, want 1", n)
	}
}

// Stopping the worker lets running jobs finish and ack before Run returns.
func TestDrainFinishesRunningJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	started, release := make(chan struct{}, 2), make(chan struct{})
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		started <- struct{}{}
		select {
		case <-release:
			return testkit.Succeed(ctx, id, spec)
		case <-ctx.Done():
			return job.Result{Status: job.StatusCanceled}, errors.New("killed")
		}
	}}
	stop := b.start(t, rt, nil)
	ids := []string{b.submit(t, "a"), b.submit(t, "b")}
	testkit.Receive(t, started, 10*time.Second, "the first job's run")
	testkit.Receive(t, started, 10*time.Second, "the second job's run")
	var once sync.Once
	finish := func() { once.Do(func() { close(release) }) }
	t.Cleanup(finish) // a failure below must not leave the drain waiting
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	// Run returns only when both are done.
	testkit.Quiet(t, stopped, 300*time.Millisecond, "Run returning while its jobs ran")
	finish()
	testkit.Closed(t, stopped, 10*time.Second, "Run to return once its jobs were done")
	for _, id := range ids {
		rec, err := b.store.GetJob(context.Background(), id)
		if err != nil || rec.Status != job.StatusSucceeded {
			t.Fatalf("job %s after drain: %+v %v", id, rec, err)
		}
	}
	if a, p := b.pending(t); a != 0 || p != 0 {
		t.Fatalf("after drain: %d unacked, %d pending", a, p)
	}
}

// A drain that outlasts its grace period hands the job back instead of failing it.
func TestForcedDrainHandsJobBack(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	started := make(chan struct{}, 1)
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		started <- struct{}{}
		<-ctx.Done()
		return job.Result{Status: job.StatusCanceled, Error: job.NewFailure(job.CategoryCanceled, "killed")}, nil
	}}
	stop := b.start(t, rt, func(c *Config) { c.DrainTimeout = 300 * time.Millisecond })
	id := b.submit(t, "sleep_forever()")
	testkit.Receive(t, started, 10*time.Second, "the job's run")
	stop()
	rec, err := b.store.GetJob(context.Background(), id)
	if err != nil || rec.Status.Terminal() {
		t.Fatalf("forced drain wrote a terminal status: %+v %v", rec, err)
	}
	// The job is back on the queue: another worker runs it as attempt 2.
	b.start(t, &testkit.Runtime{Script: testkit.Succeed}, func(c *Config) { c.ID = "w-second" })
	rec = b.waitTerminal(t, id, 15*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 2 || rec.Result.Worker != "w-second" {
		t.Fatalf("after hand-back: %+v %+v", rec, rec.Result)
	}
}

// createErr stands for sandbox.ErrCreate's error, matched by behaviour.
type createErr struct{}

func (createErr) Error() string             { return "sandbox could not be created: runc refused" }
func (createErr) SandboxCreateFailed() bool { return true }

// A sandbox that cannot be created is counted in
// kiln_sandbox_create_failures_total; other failures are not.
func TestSandboxCreateFailureIsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1})
	reader := sdkmetric.NewManualReader()
	m, err := ktrace.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	fail := func(err error) func(context.Context, string, job.Spec) (job.Result, error) {
		return func(context.Context, string, job.Spec) (job.Result, error) {
			return job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, err.Error())}, err
		}
	}
	rt := &testkit.Runtime{}
	var calls atomic.Int64
	rt.Script = func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		if calls.Add(1) == 1 {
			return fail(fmt.Errorf("run job: %w", createErr{}))(ctx, id, spec)
		}
		return fail(errors.New("metrics unreadable"))(ctx, id, spec)
	}
	b.start(t, rt, func(c *Config) { c.Metrics = m; c.Concurrency = 1 })
	for _, code := range []string{"first()", "second()"} {
		id := b.submit(t, code)
		if rec := b.waitTerminal(t, id, 15*time.Second); rec.Status != job.StatusInternalError {
			t.Fatalf("record %+v", rec)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var got int64 = -1
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if sum, ok := mt.Data.(metricdata.Sum[int64]); ok && strings.Contains(mt.Name, "sandbox_create_failures") {
				got = 0
				for _, dp := range sum.DataPoints {
					got += dp.Value
				}
			}
		}
	}
	if got != 1 {
		t.Fatalf("sandbox create failures counted %d, want 1 (of one create failure and one other failure)", got)
	}
}
