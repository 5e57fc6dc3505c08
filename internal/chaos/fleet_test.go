package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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

// A fleet on a private containerd: an API in this process (over httptest),
// NATS and Redis from internal/testenv, and workers whose sandboxes run on
// a containerd the test may kill.

// runLedger counts, per job, the runs whose program printed: each is a run
// of the job's code, whatever the worker made of it afterwards.
type runLedger struct {
	mu    sync.Mutex
	ran   map[string]int
	calls atomic.Int64 // Run calls
	held  atomic.Int64 // Run calls that could not create a sandbox
}

func (l *runLedger) of(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ran[id]
}

// ledgerRuntime is the real sandbox, with its runs counted in the ledger.
type ledgerRuntime struct {
	*sandbox.Containerd
	l *runLedger
}

func (r ledgerRuntime) Run(ctx context.Context, req sandbox.Request) (job.Result, error) {
	r.l.calls.Add(1)
	var printed atomic.Bool
	out := req.Output
	req.Output = func(stream string, p []byte) {
		if stream == "stdout" && len(p) > 0 && !printed.Swap(true) {
			r.l.mu.Lock()
			r.l.ran[req.ID]++
			r.l.mu.Unlock()
		}
		if out != nil {
			out(stream, p)
		}
	}
	res, err := r.Containerd.Run(ctx, req)
	if errors.Is(err, sandbox.ErrCreate) {
		r.l.held.Add(1)
	}
	return res, err
}

// fleetLog keeps the fleet's log lines, for the account of a job that
// went wrong; warnings and errors go to stderr as well.
type fleetLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *fleetLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	if !bytes.Contains(p, []byte("level=INFO")) {
		_, _ = os.Stderr.Write(p)
	}
	return len(p), nil
}

// about returns the lines that mention s.
func (l *fleetLog) about(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			b.WriteString(line)
		}
	}
	return b.String()
}

func (l *fleetLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// fleetQueue: heartbeats keep every held or running job's message; a
// delivery spent would come back within seconds.
var fleetQueue = queue.Config{AckWait: 5 * time.Second, MaxDeliver: 3}

// fleet is the pipeline under test.
type fleet struct {
	ctrd    *privateContainerd
	store   *cache.Store
	nc      *nats.Conn
	api     *client.Client
	ledger  *runLedger
	log     *fleetLog
	workers []fleetWorker
}

// fleetWorker is one worker of the fleet with its probes.
type fleetWorker struct {
	id      string
	readyz  string // its /readyz URL
	metrics *sdkmetric.ManualReader
}

// workerSpec is one worker of a fleet: its slots, and whether it runs every
// job in a container of its own (boxes off: the fallback path).
type workerSpec struct {
	slots    int
	boxesOff bool
}

// startFleet starts the API and a worker of each spec serving runtime from
// image on ctrd, all stopped when the test ends.
func startFleet(t *testing.T, ctrd *privateContainerd, runtime, image string, specs ...workerSpec) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{ctrd: ctrd, ledger: &runLedger{ran: map[string]int{}}, log: &fleetLog{}}
	redis := testenv.StartRedis(t)
	ns := testenv.StartNATS(t)
	var err error
	if f.store, err = cache.New(ctx, cache.Config{URL: redis.URL()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.store.Close() })
	if f.nc, err = nats.Connect(ns.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	srv, err := producer.New(ctx, producer.Config{Store: f.store, NATS: f.nc, Queue: fleetQueue, RuntimeCacheTTL: 100 * time.Millisecond,
		Logger: f.log.logger().With(slog.String("process", "api"))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	if f.api, err = client.New(hs.URL); err != nil {
		t.Fatal(err)
	}
	for i, spec := range specs {
		f.workers = append(f.workers, f.startWorker(t, fmt.Sprintf("chaos-ctrd-%d-%s", i, job.NewID()[26:]), spec, runtime, image))
	}
	// Should the test end while containerd is dead, the workers stop (in
	// the cleanups above, run after this one) with containerd back.
	t.Cleanup(func() {
		if ctrd.pid == 0 {
			ctrd.start()
		}
	})
	testkit.Eventually(t, time.Minute, "every worker ready", f.allReady)
	testkit.Eventually(t, time.Minute, "the runtime registered", func() bool {
		rts, err := f.store.Runtimes(ctx)
		return err == nil && len(rts) > 0
	})
	return f
}

func (f *fleet) startWorker(t *testing.T, id string, spec workerSpec, runtime, image string) fleetWorker {
	t.Helper()
	log := f.log.logger().With(slog.String("process", id))
	sb, err := sandbox.New(context.Background(), sandbox.Config{Address: f.ctrd.addr, Namespace: sandbox.NamespaceDefault, WorkerID: id,
		Images: map[string]string{runtime: image}, LeaseScope: f.store.Identity(), Logger: log,
		Boxes: sandbox.BoxConfig{Off: spec.boxesOff}})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	metrics, err := ktrace.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{ID: id, Runtime: ledgerRuntime{sb, f.ledger}, Store: f.store, NATS: f.nc, Concurrency: spec.slots,
		Queue: fleetQueue, Heartbeat: 500 * time.Millisecond, DrainTimeout: 10 * time.Second, Metrics: metrics, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(w.HealthHandler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker %s: %v", id, err)
		}
		hs.Close()
		if err := sb.Close(); err != nil {
			t.Errorf("worker %s: close its runtime: %v", id, err)
		}
	})
	return fleetWorker{id: id, readyz: hs.URL + "/readyz", metrics: reader}
}

var probeClient = &http.Client{Timeout: 5 * time.Second}

// ready asks the worker's /readyz: 200 (true) or 503 (false), with the body.
func (w fleetWorker) ready() (bool, string, error) {
	resp, err := probeClient.Get(w.readyz)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, string(body), nil
	case http.StatusServiceUnavailable:
		return false, string(body), nil
	}
	return false, "", fmt.Errorf("/readyz: %d %s", resp.StatusCode, body)
}

func (f *fleet) allReady() bool {
	for _, w := range f.workers {
		if ok, _, _ := w.ready(); !ok {
			return false
		}
	}
	return true
}

// sandboxUp reads the worker's kiln_worker_sandbox_up (-1: not reported).
func (w fleetWorker) sandboxUp(t *testing.T) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := w.metrics.Collect(context.Background(), &rm); err != nil {
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

// submitUntilAccepted submits spec, again after every temporary refusal
// (counted in refused).
func submitUntilAccepted(ctx context.Context, c *client.Client, spec job.Spec, refused *atomic.Int64) (string, error) {
	for {
		sub, err := c.Submit(ctx, spec)
		var ce *client.Error
		if !errors.As(err, &ce) || !ce.Temporary() {
			return sub.ID, err
		}
		refused.Add(1)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
