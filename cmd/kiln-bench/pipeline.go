package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/e2bapi"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
	"github.com/kilnrun/kiln/worker"
)

// rowPipeline is the end-to-end row: POST /v1/jobs?wait=30s with the cache off.
const rowPipeline = "pipeline e2e (POST ?wait)"

// overheadTarget is the pipeline's acceptance target (e2e median −
// in-process sandbox median). A miss is printed, not fatal.
const overheadTarget = 5 * time.Millisecond

func init() {
	p := &pipeline{}
	register(section{
		Name:   "pipeline",
		Order:  1, // after the sandbox rows it is compared with
		Setup:  p.setup,
		Ratios: []ratio{{rowPipeline, rowInProcess}},
		Report: p.reportOverhead,
		Phase:  p.load,
	})
}

// pipeline is the whole of Kiln in this process, as `kiln dev` wires it but
// with every part private to the run: embedded NATS JetStream with its store
// in a temp dir, a private redis-server, the real API handler served over
// loopback HTTP, and a worker on the real containerd sandbox. The API and the
// worker get their own NATS connections and Redis pools, as separate
// processes would. Telemetry goes to no-op providers: nothing is exported.
type pipeline struct {
	// name is the e2e row's name (default rowPipeline); tweak adjusts the
	// worker's sandbox configuration (the fresh-path and pool variants).
	name  string
	tweak func(*sandbox.Config)
	// tenants is how many tenants the API serves (default 1), each with a
	// key of its own (keys); key, the first, is every row's but the
	// tenant rows'.
	tenants int
	base    string              // http://127.0.0.1:port
	natsURL string              // the embedded NATS server's
	ns      *server.Server      // the embedded NATS server
	rds     *privateRedis       // the private redis-server
	key     string              // the API key every request carries
	keys    []string            // one per tenant
	hc      *http.Client        // keep-alive connections, enough for every client
	sb      *sandbox.Containerd // the worker's sandbox runtime (the throughput baseline calls it directly)
	slots   int                 // worker concurrency
	runs    atomic.Int64        // sandbox runs made by the worker
	took    sync.Map            // job id → time.Duration of its sandbox.Run in the worker
	segs    []segments          // one per e2e row run, warm-up first
}

func (p *pipeline) setup(ctx context.Context, o *options) (rows []row, cleanup func(), err error) {
	if !o.Pipeline {
		return nil, nil, nil
	}
	// Every step pushes its undo; a failure part-way undoes what was done.
	var undo []func()
	undoAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	cleanup = undoAll
	defer func() {
		if err != nil {
			undoAll() // a failing return has set cleanup to nil
		}
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tp := tracenoop.NewTracerProvider()
	metrics, err := ktrace.NewMetrics(metricnoop.NewMeterProvider())
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}

	tmp, err := os.MkdirTemp("", "kiln-bench-pipeline-")
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { os.RemoveAll(tmp) })

	rds, err := startRedis(ctx, tmp)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, rds.stop)
	p.rds = rds

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(tmp, "jetstream"), NoSigs: true, NoLog: true, ServerName: "kiln-bench"})
	if err != nil {
		return nil, nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	undo = append(undo, func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, nil, errors.New("embedded NATS did not start within 10s")
	}
	p.natsURL, p.ns = ns.ClientURL(), ns
	connect := func(name string) (*nats.Conn, error) {
		nc, err := nats.Connect(ns.ClientURL(), nats.Name(name))
		if err != nil {
			return nil, fmt.Errorf("connect to embedded NATS: %w", err)
		}
		undo = append(undo, nc.Close)
		return nc, nil
	}
	store := func() (*cache.Store, error) {
		s, err := cache.New(ctx, cache.Config{URL: rds.URL(), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("private redis: %w", err)
		}
		undo = append(undo, func() { s.Close() })
		return s, nil
	}

	// The API.
	apiNC, err := connect("kiln-bench-api")
	if err != nil {
		return nil, nil, err
	}
	apiStore, err := store()
	if err != nil {
		return nil, nil, err
	}
	// With a key configured, as a deployed API is: every request pays the check.
	apiKeys := map[string]string{}
	for i := range max(p.tenants, 1) {
		k := rand.Text()
		p.keys = append(p.keys, k)
		apiKeys[k] = "kiln-bench"
		if i > 0 {
			apiKeys[k] = fmt.Sprintf("kiln-bench-%05d", i)
		}
	}
	p.key = p.keys[0]
	srv, err := producer.New(ctx, producer.Config{Store: apiStore, NATS: apiNC, APIKeys: apiKeys,
		Logger: log, TracerProvider: tp, Metrics: metrics, SessionsPerTenant: benchSessionsMax})
	if err != nil {
		return nil, nil, fmt.Errorf("api: %w", err)
	}
	// E2B's surface, as `kiln api` mounts it (the sessions section's E2B row).
	d := producer.DomainOf(srv)
	d.Mount(e2bapi.New(d, log))
	// Its background loops (the store's write probe, the audit drain) end
	// before its NATS connection and Redis close, as a section cleaned up
	// before the phases that follow must not log their failures.
	undo = append(undo, srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("api listener: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	hs.RegisterOnShutdown(srv.StopLongPolls)
	// Labelled for CPU profiles: every connection's goroutine inherits it.
	go pprof.Do(context.WithoutCancel(ctx), pprof.Labels("kiln-bench", "api"), func(context.Context) { _ = hs.Serve(ln) })
	undo = append(undo, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	})
	p.base = "http://" + ln.Addr().String()
	tr := &http.Transport{Proxy: nil, MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	p.hc = &http.Client{Transport: tr}
	undo = append(undo, tr.CloseIdleConnections)

	// The worker: one slot per core, its own sandbox runtime and a unique id,
	// so its start-up reaping never touches another process's containers.
	wNC, err := connect("kiln-bench-worker")
	if err != nil {
		return nil, nil, err
	}
	wStore, err := store()
	if err != nil {
		return nil, nil, err
	}
	id := fmt.Sprintf("kiln-bench-pipeline-%d-%s", os.Getpid(), rand.Text()[:6])
	p.slots = runtime.NumCPU()
	var busy atomic.Pointer[worker.Worker]
	cfg := sandbox.Config{
		Address:   cmp.Or(os.Getenv("KILN_CONTAINERD_ADDRESS"), sandbox.AddressDefault),
		Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"),
		WorkerID:  id, Logger: log, TracerProvider: tp,
		// Several pipelines share the host, each with its own Redis: a
		// worker judges by its leases only the sandboxes of its own store.
		LeaseScope: wStore.Identity(),
	}
	if p.tweak != nil {
		p.tweak(&cfg)
	}
	cfg.Pool.Busy = func() bool { w := busy.Load(); return w != nil && w.Busy() >= p.slots }
	sb, err := sandbox.New(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("worker sandbox: %w", err)
	}
	undo = append(undo, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = sb.Settle(sctx)
		reap(sb, id)
		sb.Close()
	})
	p.sb = sb
	w, err := worker.New(worker.Config{ID: id, Runtime: countingRuntime{sb, &p.runs, &p.took}, Store: wStore, NATS: wNC,
		Concurrency: p.slots, DrainTimeout: 10 * time.Second, Logger: log, TracerProvider: tp, Metrics: metrics,
		// One tenant holds every session: the report's idle sessions are
		// admitted by their memory_mb, and need more than a worker's
		// default budget and its one tenant's share of it.
		Sessions: worker.SessionConfig{Max: benchSessionsMax, MemoryBytes: benchSessionsMemory, TenantMemoryBytes: benchSessionsMemory}})
	if err != nil {
		return nil, nil, fmt.Errorf("worker: %w", err)
	}
	busy.Store(w)
	// The worker outlives an interrupt until clean-up stops it, so it drains
	// while Redis and NATS are still there.
	wctx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	undo = append(undo, func() {
		stopWorker()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: pipeline worker:", err)
		}
	})
	if err := waitRuntime(ctx, apiStore, done); err != nil {
		return nil, nil, err
	}

	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()})
	if err != nil {
		return nil, nil, err
	}
	rows = []row{{cmp.Or(p.name, rowPipeline), func(ctx context.Context) error { return p.e2e(ctx, body) }}}
	return rows, cleanup, nil
}

// waitRuntime waits until the worker has registered a runtime, which is
// when the API starts accepting jobs for it.
func waitRuntime(ctx context.Context, s *cache.Store, workerDone <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		rts, err := s.Runtimes(ctx)
		if err == nil && len(rts) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the worker registered no runtime within 30s (last error: %v)", err)
		}
		select {
		case err := <-workerDone:
			return fmt.Errorf("worker stopped at start: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// countingRuntime is the real sandbox, counted, so the cache phase can prove
// a hit ran nothing and the throughput phase that every job ran; and timed,
// so an e2e run's overhead is measured against its own sandbox run.
type countingRuntime struct {
	*sandbox.Containerd
	runs *atomic.Int64
	took *sync.Map
}

func (r countingRuntime) Run(ctx context.Context, req sandbox.Request) (job.Result, error) {
	r.runs.Add(1)
	start := time.Now()
	res, err := r.Containerd.Run(ctx, req)
	r.took.Store(req.ID, time.Since(start))
	return res, err
}

// segments splits one e2e run by the job's own timestamps (same process,
// same clock): sent → created_at → started_at → [sandbox.Run] → finished_at
// → answered. total is the client's latency.
type segments struct{ total, apiIn, toWorker, worker, sandbox, answer time.Duration }

// overhead is the run's latency less its own sandbox run.
func (s segments) overhead() time.Duration { return s.total - s.sandbox }

// e2e is one run of the end-to-end row.
func (p *pipeline) e2e(ctx context.Context, body []byte) error {
	sent := time.Now()
	res, err := p.submitWait(ctx, body)
	if err != nil {
		return err
	}
	answered := time.Now()
	if res.Status != job.StatusSucceeded || res.CacheHit {
		return fmt.Errorf("job %s: status %s, cache_hit %v: %s", res.ID, res.Status, res.CacheHit, res.Stderr)
	}
	took, ok := p.took.LoadAndDelete(res.ID)
	if !ok || res.CreatedAt == nil || res.StartedAt == nil || res.FinishedAt == nil {
		return fmt.Errorf("job %s: no sandbox run recorded, or the result lacks its timestamps", res.ID)
	}
	sb := took.(time.Duration)
	p.segs = append(p.segs, segments{
		total:    answered.Sub(sent),
		apiIn:    res.CreatedAt.Sub(sent),
		toWorker: res.StartedAt.Sub(*res.CreatedAt),
		worker:   res.FinishedAt.Sub(*res.StartedAt) - sb,
		sandbox:  sb,
		answer:   answered.Sub(*res.FinishedAt),
	})
	return nil
}

// submitWait posts a spec with ?wait=30s and, should the wait end first,
// long-polls the job until it is terminal.
func (p *pipeline) submitWait(ctx context.Context, body []byte) (job.Result, error) {
	return p.submitWaitAs(ctx, p.key, body)
}

// submitWaitAs is submitWait as the tenant of key.
func (p *pipeline) submitWaitAs(ctx context.Context, key string, body []byte) (job.Result, error) {
	status, b, err := p.doAs(ctx, key, http.MethodPost, "/v1/jobs?wait=30s", body)
	for err == nil && status == http.StatusAccepted {
		var acc struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(b, &acc); err != nil || acc.ID == "" {
			return job.Result{}, fmt.Errorf("202 without a job id: %s", b)
		}
		status, b, err = p.doAs(ctx, key, http.MethodGet, "/v1/jobs/"+acc.ID+"?wait=30s", nil)
	}
	if err != nil {
		return job.Result{}, err
	}
	if status != http.StatusOK {
		return job.Result{}, fmt.Errorf("status %d: %s", status, b)
	}
	var res job.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return job.Result{}, fmt.Errorf("decode result: %w", err)
	}
	return res, nil
}

// do sends one request and reads the whole answer.
func (p *pipeline) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	return p.doAs(ctx, p.key, method, path, body)
}

// doAs is do as the tenant of key.
func (p *pipeline) doAs(ctx context.Context, key, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := p.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return resp.StatusCode, b, nil
}

// reportOverhead prints the pipeline's own cost: the e2e median less the
// sandbox rows' medians, the same per job against its own sandbox run, and
// where an e2e run's time goes.
func (p *pipeline) reportOverhead(_ context.Context, o *options, medians map[string]time.Duration) {
	e2e, ok := medians[rowPipeline]
	if !ok {
		return
	}
	fmt.Printf("\npipeline overhead (target: median ≤ %s)\n", ms(overheadTarget))
	if in, ok := medians[rowInProcess]; ok {
		d := e2e - in
		fmt.Printf("  %-44s %9s  %s\n", "e2e median − "+rowInProcess+" median", signedMS(d), mark(d <= overheadTarget))
		fmt.Println("    the fair comparison: the worker makes this same in-process call")
	}
	if ex, ok := medians[rowKilnExec]; ok {
		fmt.Printf("  %-44s %9s\n", "e2e median − "+rowKilnExec+" median", signedMS(e2e-ex))
		fmt.Println("    kiln exec also starts a process and connects to containerd per run,")
		fmt.Println("    which a long-running worker does not: this understates the overhead")
	}
	segs := p.segs[max(len(p.segs)-o.N, 0):] // the measured runs, not the warm-up
	if len(segs) == 0 {
		return
	}
	of := func(f func(segments) time.Duration) []time.Duration {
		ds := make([]time.Duration, len(segs))
		for i, s := range segs {
			ds[i] = f(s)
		}
		return ds
	}
	per := of(segments.overhead)
	fmt.Printf("  %-44s %9s  %s   (p99 %s)\n", "per job: e2e − its own sandbox.Run, median", signedMS(quantile(per, 0.5)),
		mark(quantile(per, 0.5) <= overheadTarget), ms(quantile(per, 0.99)))
	fmt.Println("    paired in the same run, so the sandbox's run-to-run spread cancels out")
	fmt.Printf("  where an e2e run goes (medians over %d runs, from the job's own timestamps):\n", len(segs))
	for _, seg := range []struct {
		name string
		f    func(segments) time.Duration
	}{
		{"API in: HTTP, auth, decode, validate, key", func(s segments) time.Duration { return s.apiIn }},
		{"record in Redis, publish, JetStream to worker", func(s segments) time.Duration { return s.toWorker }},
		{"worker: mark running, decide (sandbox aside)", func(s segments) time.Duration { return s.worker }},
		{"sandbox.Run in the worker", func(s segments) time.Duration { return s.sandbox }},
		{"result write, done notice, long-poll answer", func(s segments) time.Duration { return s.answer }},
	} {
		fmt.Printf("    %-48s %9s\n", seg.name, ms(quantile(of(seg.f), 0.5)))
	}
}

func mark(ok bool) string {
	if ok {
		return "✓ met"
	}
	return "✗ missed"
}

func signedMS(d time.Duration) string {
	if d < 0 {
		return "−" + ms(-d)
	}
	return "+" + ms(d)
}
