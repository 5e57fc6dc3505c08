package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	ktrace "github.com/kilnrun/kiln/trace"
)

// getPage GETs url and returns the status and body.
func getPage(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestMetricsEndpoints runs `kiln api` (with API keys) and `kiln worker` as
// their commands wire them and proves each serves its own /metrics: the API
// on its listen address, reachable without an API key while the job routes
// still demand one; the worker on --metrics-addr. One job moves the API's
// submission counter and the worker's finished counter.
func TestMetricsEndpoints(t *testing.T) {
	containerd := testenv.Containerd(t)
	redis, ns := testenv.StartRedis(t), testenv.StartNATS(t)
	for _, kv := range os.Environ() { // the commands read OTEL_*; export nothing
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// kiln api, as cmdAPI sets it up.
	apiTel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-api"})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownTelemetry(ctx, log, apiTel)
	api := defaultAPIConfig()
	api.Addr, api.RedisURL, api.APIKeys, api.Logger = "127.0.0.1:0", redis.URL(), "ci:k1ln-test-key", log
	api.TracerProvider, api.Propagator, api.MetricsHandler = apiTel.TracerProvider(), apiTel.Propagator(), apiTel.MetricsHandler()
	if api.Metrics, err = ktrace.NewMetrics(apiTel.MeterProvider()); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	api.Ready = func(addr string) { ready <- addr }
	apiDone := make(chan error, 1)
	go func() { apiDone <- runAPI(ctx, api, nc) }()
	var apiURL string
	select {
	case addr := <-ready:
		apiURL = "http://" + addr
	case err := <-apiDone:
		t.Fatalf("api: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("api not listening within 20s")
	}

	// kiln worker, as cmdWorker sets it up, with its own telemetry.
	wkTel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-worker"})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownTelemetry(ctx, log, wkTel)
	var wk workerConfig
	workerFlags(flag.NewFlagSet("worker-defaults", flag.ContinueOnError), &wk, true)
	wk.ID, wk.Concurrency, wk.Containerd, wk.Namespace = "cmd-metrics-test", 1, containerd, testenv.ContainerdNamespace()
	wk.RedisURL, wk.NATSURL = redis.URL(), ns.URL()
	wk.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	wnc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	wkDone := make(chan error, 1)
	go func() { wkDone <- runWorker(ctx, wk, wnc, log, wkTel) }()

	c, err := client.New(apiURL, client.WithAPIKey("k1ln-test-key"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "a runtime to be registered", func() bool {
		select {
		case werr := <-wkDone:
			t.Fatalf("worker exited before registering a runtime: %v", werr)
		default:
		}
		rts, err := c.Runtimes(ctx)
		return err == nil && len(rts) > 0
	})
	sub, err := c.Submit(ctx, job.Spec{Runtime: "python", Code: "print('metrics')"}, client.WithWait(60*time.Second))
	if err != nil || sub.Status != job.StatusSucceeded {
		t.Fatalf("job: %+v %v", sub, err)
	}

	if code, _ := getPage(t, apiURL+"/v1/runtimes"); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/runtimes without a key: %d; want 401 (auth is on)", code)
	}
	code, page := getPage(t, apiURL+"/metrics")
	if code != http.StatusOK || !strings.Contains(page, `kiln_jobs_submitted_total{kiln_runtime="python"`) ||
		!strings.Contains(page, `kiln_cache_misses_total{kiln_runtime="python"`) {
		t.Errorf("API /metrics without a key: %d; want 200 with the submission counters:\n%s", code, page)
	}
	// The worker counts the job just after writing its result.
	want := `kiln_jobs_finished_total{kiln_runtime="python",kiln_status="succeeded"`
	if !testkit.Poll(10*time.Second, func() bool {
		code, page = getPage(t, "http://"+wk.MetricsAddr+"/metrics")
		// Boxes and the warm pool are on by default: their gauges and
		// counters too (python's jobs meet a box; node is pooled).
		return code == http.StatusOK && strings.Contains(page, want) && strings.Contains(page, "kiln_worker_slots_free") &&
			strings.Contains(page, `kiln_pool_idle{kiln_runtime="node"`) && strings.Contains(page, `kiln_box_jobs_total{kiln_box_meet="claim"`) &&
			strings.Contains(page, "kiln_boxes_live")
	}) {
		t.Fatalf("worker /metrics at %s: %d; want %s, the slot gauges, the boxes' and the pool's metrics:\n%s", wk.MetricsAddr, code, want, page)
	}
	if strings.Contains(page, "kiln_jobs_submitted_total") {
		t.Error("worker /metrics has the API's submission counter: the two share a registry")
	}

	cancel()
	for name, done := range map[string]chan error{"api": apiDone, "worker": wkDone} {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s stopped with %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s still running 30s after its context ended", name)
		}
	}
}
