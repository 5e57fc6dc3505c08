package trace

import (
	"bytes"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs the metrics handler and parses the Prometheus text.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rr.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rr.Code, rr.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(rr.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// series finds the sample of family name whose labels include want.
func series(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	fam, ok := families[name]
	if !ok {
		t.Fatalf("no %s in /metrics (have %v)", name, keys(families))
	}
next:
	for _, m := range fam.GetMetric() {
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
	t.Fatalf("no %s series with labels %v", name, want)
	return nil
}

func TestMetricsScrape(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{ServiceName: "kiln-worker"})
	m, err := NewMetrics(p.MeterProvider())
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	ctx := t.Context()
	for range 3 {
		m.JobSubmitted(ctx, "python")
	}
	m.JobSubmitted(ctx, "node")
	m.JobFinished(ctx, "python", "succeeded", 150*time.Millisecond, 1200*time.Millisecond)
	m.JobFinished(ctx, "python", "succeeded", 40*time.Millisecond, 300*time.Millisecond)
	m.JobFinished(ctx, "python", "timed_out", 10*time.Second, 11*time.Second)
	m.JobFinished(ctx, "python", "succeeded", 0, 2*time.Millisecond) // cache hit: never executed
	m.QueueWait(ctx, "python", 20*time.Millisecond)
	m.CacheHit(ctx, "python")
	m.CacheHit(ctx, "python")
	m.CacheMiss(ctx, "python")
	m.Redelivered(ctx, "python")
	m.OOMKilled(ctx, "python")
	m.TimedOut(ctx, "python")
	m.SandboxCreateFailed(ctx, "python")
	m.SandboxCreateFailed(ctx, "python")
	reg, err := m.RegisterSlots(func() (int64, int64) { return 3, 5 })
	if err != nil {
		t.Fatalf("RegisterSlots: %v", err)
	}

	fams := scrape(t, p.MetricsHandler())
	lintMetrics(t, p.MetricsHandler())
	counters := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kiln_jobs_submitted_total", map[string]string{"kiln_runtime": "python"}, 3},
		{"kiln_jobs_submitted_total", map[string]string{"kiln_runtime": "node"}, 1},
		{"kiln_jobs_finished_total", map[string]string{"kiln_runtime": "python", "kiln_status": "succeeded"}, 3},
		{"kiln_jobs_finished_total", map[string]string{"kiln_runtime": "python", "kiln_status": "timed_out"}, 1},
		{"kiln_cache_hits_total", map[string]string{"kiln_runtime": "python"}, 2},
		{"kiln_cache_misses_total", map[string]string{"kiln_runtime": "python"}, 1},
		{"kiln_redeliveries_total", nil, 1},
		{"kiln_oom_kills_total", nil, 1},
		{"kiln_timeouts_total", nil, 1},
		{"kiln_sandbox_create_failures_total", nil, 2},
	}
	for _, c := range counters {
		if got := series(t, fams, c.name, c.labels).GetCounter().GetValue(); got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := series(t, fams, "kiln_worker_slots_busy", nil).GetGauge().GetValue(); got != 3 {
		t.Errorf("kiln_worker_slots_busy = %v; want 3", got)
	}
	if got := series(t, fams, "kiln_worker_slots_free", nil).GetGauge().GetValue(); got != 5 {
		t.Errorf("kiln_worker_slots_free = %v; want 5", got)
	}

	exec := series(t, fams, "kiln_execution_duration_seconds", map[string]string{"kiln_runtime": "python"}).GetHistogram()
	if exec.GetSampleCount() != 3 || math.Abs(exec.GetSampleSum()-10.19) > 1e-9 {
		t.Errorf("execution histogram count %d sum %v; want 3 and 10.19 (the cache hit is not an execution)", exec.GetSampleCount(), exec.GetSampleSum())
	}
	buckets := map[float64]uint64{}
	for _, b := range exec.GetBucket() {
		buckets[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for le, want := range map[float64]uint64{0.001: 0, 0.05: 1, 0.25: 2, 10: 3, 300: 3} {
		if got, ok := buckets[le]; !ok || got != want {
			t.Errorf("execution bucket le=%v = %d (present %v); want %d", le, got, ok, want)
		}
	}
	if e2e := series(t, fams, "kiln_job_e2e_duration_seconds", nil).GetHistogram(); e2e.GetSampleCount() != 4 {
		t.Errorf("e2e histogram count %d; want 4", e2e.GetSampleCount())
	}
	if qw := series(t, fams, "kiln_queue_wait_duration_seconds", nil).GetHistogram(); qw.GetSampleCount() != 1 || math.Abs(qw.GetSampleSum()-0.02) > 1e-9 {
		t.Errorf("queue wait histogram count %d sum %v; want 1 and 0.02", qw.GetSampleCount(), qw.GetSampleSum())
	}

	// A stopped worker stops reporting slots rather than freezing the last value.
	if err := reg.Unregister(); err != nil {
		t.Fatalf("Unregister: %v", err)
	}
	if _, ok := scrape(t, p.MetricsHandler())["kiln_worker_slots_busy"]; ok {
		t.Error("kiln_worker_slots_busy still reported after Unregister")
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	t.Parallel()
	var m *Metrics
	ctx := t.Context()
	m.JobSubmitted(ctx, "python")
	m.JobFinished(ctx, "python", "succeeded", time.Second, time.Second)
	m.QueueWait(ctx, "python", time.Second)
	m.CacheHit(ctx, "python")
	m.CacheMiss(ctx, "python")
	m.Redelivered(ctx, "python")
	m.OOMKilled(ctx, "python")
	m.TimedOut(ctx, "python")
	m.SandboxCreateFailed(ctx, "python")
	reg, err := m.RegisterSlots(func() (int64, int64) { return 1, 1 })
	if err != nil || reg.Unregister() != nil {
		t.Fatalf("RegisterSlots on nil Metrics: %v", err)
	}
}

// lintMetrics fails on what Prometheus's metrics linter (promlint, as
// promtool check metrics runs it) finds in the page, and on any label with
// an empty value (otel_scope_version="" and the like): a label says
// something or is not there.
func lintMetrics(t *testing.T, h http.Handler) {
	t.Helper()
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	problems, err := promlint.New(bytes.NewReader(rr.Body.Bytes())).Lint()
	if err != nil {
		t.Fatalf("lint /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(rr.Body.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == "" || strings.HasPrefix(l.GetName(), "otel_scope_") {
					t.Errorf("%s has the label %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}
