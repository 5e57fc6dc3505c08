package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sandboxctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
	"github.com/kilnrun/kiln/worker"
)

// The test binary doubles as a worker process, so a test can SIGKILL or
// SIGTERM a real worker: KILN_E2E_WORKER=<id> turns it into one.
func TestMain(m *testing.M) {
	if id := os.Getenv("KILN_E2E_WORKER"); id != "" {
		os.Exit(workerProcess(id))
	}
	goleak.VerifyTestMain(m, testkit.NATSObjectPutLeak, testkit.RedisDialBackoff)
}

func workerProcess(id string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Telemetry as `kiln worker` sets it up: from the OTEL_* variables the
	// test passed (workerProc passes none of its own environment's).
	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-worker"})
	if err != nil {
		log.Error("telemetry", "error", err)
		return 1
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	nc, err := nats.Connect(os.Getenv("KILN_E2E_NATS"))
	if err != nil {
		log.Error("nats", "error", err)
		return 1
	}
	defer nc.Close()
	store, err := cache.New(ctx, cache.Config{URL: os.Getenv("KILN_E2E_REDIS")})
	if err != nil {
		log.Error("redis", "error", err)
		return 1
	}
	var images map[string]string
	if ref := os.Getenv("KILN_E2E_IMAGE_PYTHON"); ref != "" { // the python image, when not :latest
		images = map[string]string{"python": ref}
	}
	rt, err := sandbox.New(ctx, sandbox.Config{Address: os.Getenv("KILN_E2E_CONTAINERD"), Namespace: testenv.ContainerdNamespace(), WorkerID: id, Logger: log,
		Images:         images,
		LeaseScope:     store.Identity(),
		TracerProvider: tel.TracerProvider(),
		// KILN_E2E_BOXES_OFF=1: every job in a container of its own.
		Boxes: sandbox.BoxConfig{Off: os.Getenv("KILN_E2E_BOXES_OFF") == "1"}})
	if err != nil {
		log.Error("sandbox", "error", err)
		return 1
	}
	defer rt.Close()
	// KILN_E2E_ID_LEASE, when set, is the worker id's lease (how long a
	// worker whose id is held waits before it refuses to start).
	idLease, _ := time.ParseDuration(os.Getenv("KILN_E2E_ID_LEASE"))
	// KILN_E2E_SESSIONS_MEMORY_MB, when set, is the memory its sessions
	// may use together (each tenant half of it).
	sessionsMB, _ := strconv.ParseInt(os.Getenv("KILN_E2E_SESSIONS_MEMORY_MB"), 10, 64)
	w, err := worker.New(worker.Config{ID: id, Runtime: rt, Store: store, NATS: nc, Concurrency: 1,
		Sessions: worker.SessionConfig{MemoryBytes: sessionsMB << 20},
		Queue:    testQueue, Heartbeat: 300 * time.Millisecond, Logger: log, IDLease: idLease,
		TracerProvider: tel.TracerProvider(), Propagator: tel.Propagator()})
	if err != nil {
		log.Error("worker", "error", err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		log.Error("worker run", "error", err)
		return 1
	}
	return 0
}

// testQueue redelivers quickly so crash tests finish in seconds.
var testQueue = queue.Config{AckWait: 2 * time.Second, MaxDeliver: 3}

// runCounter counts sandbox runs per job id across a test's in-process workers.
type runCounter struct {
	mu    sync.Mutex
	runs  map[string]int
	total atomic.Int64
}

func (c *runCounter) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[id]
}

// countingRuntime is the real sandbox, counted.
type countingRuntime struct {
	*sandbox.Containerd
	c *runCounter
}

func (r countingRuntime) Run(ctx context.Context, req sandbox.Request) (job.Result, error) {
	r.c.mu.Lock()
	r.c.runs[req.ID]++
	r.c.mu.Unlock()
	r.c.total.Add(1)
	return r.Containerd.Run(ctx, req)
}

// leaseWatch is the real store, counting deliveries it turned away because
// another attempt of the job held a live lease.
type leaseWatch struct {
	*cache.Store
	held *atomic.Int64
}

func (s leaseWatch) MarkRunningLeased(ctx context.Context, id, worker string, attempt int, at time.Time, l cache.Lease) (job.Status, error) {
	st, err := s.Store.MarkRunningLeased(ctx, id, worker, attempt, at, l)
	if errors.Is(err, cache.ErrLeased) {
		s.held.Add(1)
	}
	return st, err
}

type env struct {
	redis      *testenv.Redis
	nats       *testenv.NATS
	containerd string
	store      *cache.Store
	nc         *nats.Conn
	api        *client.Client
	apiURL     string // the API's base URL, where setup's metrics handler is at /metrics
	runs       *runCounter
	held       atomic.Int64         // MarkRunningLeased calls refused by a live lease (polls, not jobs)
	tp         trace.TracerProvider // the API's; default for workers. Default: no exporter (real trace ids, nothing sent)
}

// telemetry is what an option can give the API (setup) or one worker
// (startWorker). Zero fields keep the defaults.
type telemetry struct {
	tp      trace.TracerProvider
	prop    propagation.TextMapPropagator
	metrics *ktrace.Metrics
	// metricsHandler, for setup only, is served at GET /metrics next to the
	// API, as `kiln api` mounts it.
	metricsHandler http.Handler
	// images, for startWorker only, maps runtimes to image references.
	images map[string]string
	// boxesOff, for startWorker only, runs every job in a container of
	// its own (the fallback path).
	boxesOff bool
	// pool, for startWorker only, keeps one sandbox per runtime ready
	// (the warm pool).
	pool bool
	// worker, for startWorker only, adjusts the worker's configuration.
	worker func(*worker.Config)
	// sandbox, for startWorker only, is told the worker's runtime.
	sandbox func(*sandbox.Containerd)
}

type option func(*telemetry)

// withTracerProvider makes the spans with tp; a worker's sandbox gets it too.
func withTracerProvider(tp trace.TracerProvider) option {
	return func(c *telemetry) { c.tp = tp }
}

// withProviders wires p as the kiln commands do: its tracer provider and
// propagator, m on its meter provider, and (for the API) its /metrics.
func withProviders(p *ktrace.Providers, m *ktrace.Metrics) option {
	return func(c *telemetry) {
		c.tp, c.prop, c.metrics, c.metricsHandler = p.TracerProvider(), p.Propagator(), m, p.MetricsHandler()
	}
}

// withImages runs the worker's sandboxes from these images (runtime → reference).
func withImages(images map[string]string) option {
	return func(c *telemetry) { c.images = images }
}

// withBoxesOff runs the worker's jobs in containers of their own.
func withBoxesOff() option {
	return func(c *telemetry) { c.boxesOff = true }
}

// withSandbox hands the test the worker's runtime (to read its pool).
func withSandbox(f func(*sandbox.Containerd)) option {
	return func(c *telemetry) { c.sandbox = f }
}

// withPool gives the worker a warm pool of one sandbox per runtime.
func withPool() option {
	return func(c *telemetry) { c.pool = true }
}

func applyOptions(opts []option) telemetry {
	var c telemetry
	for _, o := range opts {
		o(&c)
	}
	return c
}

func setup(t *testing.T, opts ...option) *env {
	t.Helper()
	addr := testenv.Containerd(t)
	ctx := context.Background()
	tel := applyOptions(opts)
	e := &env{redis: testenv.StartRedis(t), nats: testenv.StartNATS(t), containerd: addr, runs: &runCounter{runs: map[string]int{}},
		tp: tel.tp}
	if e.tp == nil {
		e.tp = sdktrace.NewTracerProvider()
	}
	var err error
	if e.store, err = cache.New(ctx, cache.Config{URL: e.redis.URL()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	if e.nc, err = nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, TracerProvider: e.tp,
		Propagator: tel.prop, Metrics: tel.metrics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	handler := srv.Handler()
	if tel.metricsHandler != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.metricsHandler)
		mux.Handle("/", handler)
		handler = mux
	}
	hs := serveAPI(t, handler)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	e.apiURL = hs.URL
	if e.api, err = client.New(hs.URL); err != nil {
		t.Fatal(err)
	}
	return e
}

// startWorker runs an in-process worker on the real sandbox. Its spans and
// its sandbox's go to the API's tracer provider unless an option says otherwise.
func (e *env) startWorker(t *testing.T, id string, concurrency int, opts ...option) (stop func()) {
	t.Helper()
	ctx := context.Background()
	tel := applyOptions(opts)
	tp := tel.tp
	if tp == nil {
		tp = e.tp
	}
	sb, err := sandbox.New(ctx, sandbox.Config{Address: e.containerd, Namespace: testenv.ContainerdNamespace(), WorkerID: id, TracerProvider: tp, Images: tel.images,
		LeaseScope: e.store.Identity(), Boxes: sandbox.BoxConfig{Off: tel.boxesOff}, Pool: poolOf(tel.pool)})
	if err != nil {
		t.Fatal(err)
	}
	if tel.sandbox != nil {
		tel.sandbox(sb)
	}
	wcfg := worker.Config{ID: id, Runtime: countingRuntime{sb, e.runs}, Store: leaseWatch{e.store, &e.held}, NATS: e.nc,
		Concurrency: concurrency, Queue: testQueue, Heartbeat: 300 * time.Millisecond, TracerProvider: tp,
		Propagator: tel.prop, Metrics: tel.metrics}
	if tel.worker != nil {
		tel.worker(&wcfg)
	}
	w, err := worker.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker %s: %v", id, err)
			}
			sb.Close()
		})
	}
	t.Cleanup(stop)
	e.waitRuntime(t)
	return stop
}

// waitRuntime waits until a worker has registered the python runtime.
func (e *env) waitRuntime(t *testing.T) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, "a worker to register a runtime", func() bool {
		rts, err := e.store.Runtimes(context.Background())
		return err == nil && len(rts) > 0
	})
}

// waitAcked waits until the job stream holds no message: every job was
// acked (or terminated), so none is left for JetStream to deliver again.
// A work-queue stream removes a message once it is acked, so this is what
// a fixed wait "longer than AckWait" used to stand for, known at once.
func (e *env) waitAcked(t *testing.T, within time.Duration) {
	t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitJobsDrained(t, js, within)
}

// workerProc runs a worker as a child process (the test binary in worker
// mode). extraEnv ("K=V") is added to its environment; OTEL_* variables of
// the test's own environment are not passed on, so a developer's shell never
// makes a test worker export anywhere.
func (e *env) workerProc(t *testing.T, id string, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := e.workerCmd(id, extraEnv...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		reapWorker(t, e.containerd, id) // a killed worker leaves its sandbox behind
	})
	e.waitRuntime(t)
	return cmd
}

// workerCmd is the command of a worker process (the test binary in worker
// mode) against the test's stores, not yet started.
func (e *env) workerCmd(id string, extraEnv ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "KILN_E2E_WORKER="+id, "KILN_E2E_NATS="+e.nats.URL(),
		"KILN_E2E_REDIS="+e.redis.URL(), "KILN_E2E_CONTAINERD="+e.containerd)
	cmd.Env = append(cmd.Env, extraEnv...)
	return cmd
}

// waitRecord polls the record until cond holds.
func (e *env) waitRecord(t *testing.T, id string, within time.Duration, cond func(cache.Record) bool) cache.Record {
	t.Helper()
	var rec cache.Record
	var err error
	if !testkit.Poll(within, func() bool {
		rec, err = e.store.GetJob(context.Background(), id)
		return err == nil && cond(rec)
	}) {
		t.Fatalf("job %s: condition not met within %v (status %q, worker %q, err %v)", id, within, rec.Status, rec.Worker, err)
	}
	return rec
}

// sandboxesOf lists the containers labelled with workerID in the test's
// containerd namespace: the boxes and containers that worker made.
func sandboxesOf(t *testing.T, address, workerID string) []string {
	t.Helper()
	cc, err := containerd.New(address)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := namespaces.WithNamespace(context.Background(), testenv.ContainerdNamespace())
	cs, err := cc.Containers(ctx, fmt.Sprintf("labels.%q==%s", sandboxctrd.LabelWorker, strconv.Quote(workerID)))
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID()
	}
	return ids
}

func py(format string, args ...any) job.Spec {
	return job.Spec{Runtime: "python", Code: fmt.Sprintf(format, args...)}
}

// poolOf is startWorker's warm pool: one sandbox per runtime, or none.
func poolOf(on bool) sandbox.PoolConfig {
	if !on {
		return sandbox.PoolConfig{}
	}
	return sandbox.PoolConfig{Max: 1, Min: 1}
}
