package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	ktrace "github.com/kilnrun/kiln/trace"
)

// clearOTELEnv unsets every OTEL_* variable for the test (restored after),
// so the developer's shell cannot point the test's providers anywhere.
func clearOTELEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "") // registers the restore
			os.Unsetenv(k)
		}
	}
}

// telemetryFor sets up one process's providers from the environment, as
// `kiln api` and `kiln worker` do, with the kiln_* instruments on them.
func telemetryFor(t *testing.T, service string, cfg ktrace.Config) (*ktrace.Providers, *ktrace.Metrics) {
	t.Helper()
	cfg.ServiceName = service
	p, err := ktrace.Setup(context.Background(), cfg)
	if err != nil {
		t.Fatalf("telemetry for %s: %v", service, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx) // idempotent; tests that care shut down themselves
	})
	m, err := ktrace.NewMetrics(p.MeterProvider())
	if err != nil {
		t.Fatalf("metrics for %s: %v", service, err)
	}
	return p, m
}

// serveMetrics serves h at GET /metrics on a listener of its own, as `kiln
// worker` does on KILN_METRICS_ADDR; it returns the page's URL.
func serveMetrics(t *testing.T, h http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// metricsPage is one parsed scrape.
type metricsPage map[string]*dto.MetricFamily

func scrape(t *testing.T, url string) metricsPage {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// sample returns the series of family name whose labels include want, or nil.
func (p metricsPage) sample(name string, want map[string]string) *dto.Metric {
next:
	for _, m := range p[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// counter is the value of a counter series; 0 when it was never incremented
// (the exporter shows a series only once it has a value).
func (p metricsPage) counter(name string, labels map[string]string) float64 {
	return p.sample(name, labels).GetCounter().GetValue()
}

// gauge is the value of a gauge series and whether it is there.
func (p metricsPage) gauge(name string) (float64, bool) {
	m := p.sample(name, nil)
	return m.GetGauge().GetValue(), m != nil
}

// histogram is the count and sum of a histogram series.
func (p metricsPage) histogram(name string, labels map[string]string) (uint64, float64) {
	h := p.sample(name, labels).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// Acceptance 4 (issue 4): /metrics on the API and on the worker expose the
// kiln_* series, and they move as jobs run: submissions and cache hits and
// misses on the API; finished jobs by runtime and status, queue wait,
// execution and end-to-end histograms, busy and free slots, redeliveries,
// OOM kills and timeouts on the worker.
func TestMetricsMoveWithJobs(t *testing.T) {
	clearOTELEnv(t)
	apiTel, apiMetrics := telemetryFor(t, "kiln-api", ktrace.Config{})
	wkTel, wkMetrics := telemetryFor(t, "kiln-worker", ktrace.Config{})
	e := setup(t, withProviders(apiTel, apiMetrics))
	apiURL := e.apiURL + "/metrics" // mounted beside the API, as `kiln api` does
	wkURL := serveMetrics(t, wkTel.MetricsHandler())
	python := map[string]string{"kiln_runtime": "python"}
	status := func(s job.Status) map[string]string {
		return map[string]string{"kiln_runtime": "python", "kiln_status": string(s)}
	}

	before := scrape(t, apiURL)
	if n := before.counter("kiln_jobs_submitted_total", python); n != 0 {
		t.Fatalf("kiln_jobs_submitted_total is %v before any job", n)
	}
	if _, ok := before["go_goroutines"]; !ok {
		t.Error("API /metrics lacks the Go runtime metrics")
	}

	// A redelivery: a child worker takes a job and is SIGKILLed; the
	// in-process worker (the one with metrics) runs attempt 2.
	const victimID = "e2e-metrics-victim"
	victim := e.workerProc(t, victimID)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	redelivered, err := e.api.Submit(ctx, py("import time\ntime.sleep(3)\nprint('redelivered')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, redelivered.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	// No worker is alive: a job submitted now stays queued. Canceling it
	// counts it once on the API as finished (canceled), however often asked.
	queued, err := e.api.Submit(ctx, py("print('never runs')"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if v, err := e.api.Cancel(ctx, queued.ID); err != nil || v.Status != job.StatusCanceled {
			t.Fatalf("cancel queued job: %+v %v", v, err)
		}
	}
	const slots = 2
	e.startWorker(t, "e2e-metrics", slots, withProviders(wkTel, wkMetrics))

	// While attempt 2 runs, one slot is busy.
	testkit.Eventually(t, 30*time.Second, "kiln_worker_slots_busy 1 while the redelivered job runs", func() bool {
		p := scrape(t, wkURL)
		busy, ok1 := p.gauge("kiln_worker_slots_busy")
		free, ok2 := p.gauge("kiln_worker_slots_free")
		return ok1 && ok2 && busy == 1 && free == slots-1
	})

	// One job of each outcome the metrics distinguish.
	oom := py(`"A" * 10**10`)
	oom.Limits.MemoryMB = 64
	slow := py("import time\ntime.sleep(30)")
	slow.Limits.TimeoutMS = 1000
	outcomes := []struct {
		spec job.Spec
		want job.Status
	}{
		{py("print('ok')"), job.StatusSucceeded},
		{py("import sys\nsys.exit(3)"), job.StatusFailed},
		{slow, job.StatusTimedOut},
		{oom, job.StatusOOMKilled},
	}
	var wg sync.WaitGroup
	for _, o := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, err := e.api.Submit(ctx, o.spec, client.WithWait(60*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			if sub.Status != o.want {
				t.Errorf("%q: %s %+v; want %s", o.spec.Code, sub.Status, sub.Error, o.want)
			}
		}()
	}
	wg.Wait()
	if v, err := e.api.Wait(ctx, redelivered.ID); err != nil || v.Status != job.StatusSucceeded || v.Attempt != 2 {
		t.Fatalf("redelivered job: %+v %v; want succeeded on attempt 2", v.Result, err)
	}
	// The first job again: answered from the result cache by the API.
	if hit, err := e.api.Submit(ctx, outcomes[0].spec); err != nil || !hit.CacheHit {
		t.Fatalf("resubmission: %+v %v; want a cache hit", hit, err)
	}
	if t.Failed() {
		t.FailNow()
	}
	const ran = 5        // the redelivered job and the four outcomes; the cache hit ran nothing
	const queuedOnly = 1 // the job canceled while queued

	api := scrape(t, apiURL)
	for _, c := range []struct {
		name string
		want float64
	}{
		{"kiln_jobs_submitted_total", ran + queuedOnly},
		{"kiln_cache_misses_total", ran + queuedOnly},
		{"kiln_cache_hits_total", 1},
	} {
		if got := api.counter(c.name, python); got != c.want {
			t.Errorf("API %s{kiln_runtime=python} = %v; want %v", c.name, got, c.want)
		}
	}
	if got := api.counter("kiln_jobs_finished_total", status(job.StatusCanceled)); got != queuedOnly {
		t.Errorf("API kiln_jobs_finished_total{kiln_status=canceled} = %v; want %v", got, queuedOnly)
	}

	// The worker writes the result before it counts the job: wait for the last count.
	var wk metricsPage
	testkit.Eventually(t, 10*time.Second, "worker counters for every finished job", func() bool {
		wk = scrape(t, wkURL)
		n, _ := wk.histogram("kiln_job_e2e_duration_seconds", python)
		return n >= ran
	})
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kiln_jobs_finished_total", status(job.StatusSucceeded), 2},
		{"kiln_jobs_finished_total", status(job.StatusFailed), 1},
		{"kiln_jobs_finished_total", status(job.StatusTimedOut), 1},
		{"kiln_jobs_finished_total", status(job.StatusOOMKilled), 1},
		{"kiln_redeliveries_total", python, 1},
		{"kiln_timeouts_total", python, 1},
		{"kiln_oom_kills_total", python, 1},
	} {
		if got := wk.counter(c.name, c.labels); got != c.want {
			t.Errorf("worker %s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	// Histograms: one sample per run. Queue wait counts from submission, so
	// the redelivered job alone waited at least AckWait for its second
	// delivery; execution includes its 3 s sleep and the 1 s timeout.
	for _, h := range []struct {
		name   string
		minSum float64
	}{
		{"kiln_queue_wait_duration_seconds", testQueue.AckWait.Seconds()},
		{"kiln_execution_duration_seconds", 4},
		{"kiln_job_e2e_duration_seconds", 4 + testQueue.AckWait.Seconds()},
	} {
		if n, sum := wk.histogram(h.name, python); n != ran || sum < h.minSum {
			t.Errorf("worker %s: %d samples, sum %.3fs; want %d samples, sum ≥ %.0fs", h.name, n, sum, ran, h.minSum)
		}
	}
	if busy, _ := wk.gauge("kiln_worker_slots_busy"); busy != 0 {
		t.Errorf("kiln_worker_slots_busy = %v with nothing running", busy)
	}
	if free, _ := wk.gauge("kiln_worker_slots_free"); free != slots {
		t.Errorf("kiln_worker_slots_free = %v with nothing running; want %d", free, slots)
	}
	// Each process reports what it does: the API only the jobs it finished
	// itself (canceled while queued), the worker no submissions.
	for _, st := range job.Statuses {
		if got := api.counter("kiln_jobs_finished_total", status(st)); st != job.StatusCanceled && got != 0 {
			t.Errorf("API kiln_jobs_finished_total{kiln_status=%s} = %v; only workers run jobs", st, got)
		}
	}
	if _, ok := wk["kiln_jobs_submitted_total"]; ok {
		t.Error("worker /metrics reports kiln_jobs_submitted_total; only the API takes submissions")
	}
	// Both pages lint clean, with no empty label, and a route is a path.
	for _, url := range []string{apiURL, wkURL} {
		lintPage(t, url)
	}
	for _, m := range api["kiln_http_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "http_route" && !strings.HasPrefix(l.GetValue(), "/") && l.GetValue() != "unmatched" {
				t.Errorf("http_route %q is not a path", l.GetValue())
			}
		}
	}
}

// lintPage fails on what Prometheus's linter (promlint, as promtool check
// metrics runs it) finds in the page at url, and on any label with an
// empty value.
func lintPage(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.New(bytes.NewReader(raw)).Lint()
	if err != nil {
		t.Fatalf("lint %s: %v", url, err)
	}
	for _, p := range problems {
		t.Errorf("%s: promlint: %s: %s", url, p.Metric, p.Text)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, `=""`) {
			t.Errorf("%s: a label with an empty value: %s", url, line)
		}
	}
}
