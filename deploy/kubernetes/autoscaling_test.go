package kubernetes_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
)

// TestKEDATriggersSeeTheBacklog submits jobs for two tenants to a live API
// (real redis-server, embedded JetStream, no worker), then runs each KEDA
// trigger's query of worker-autoscaling.yaml against the API's /metrics,
// as Prometheus would after a scrape, and checks it reads the backlog that
// JetStream holds for its runtime, and that KEDA would then ask for more
// than the minimum of workers.
func TestKEDATriggersSeeTheBacklog(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_SDK_DISABLED", "")
	ctx := context.Background()
	m := load(t)
	so := get[*scaledObject](t, m, "ScaledObject", "kiln-worker")

	redis, ns := testenv.StartRedis(t), testenv.StartNATS(t)
	store, err := cache.New(ctx, cache.Config{URL: redis.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	for _, rt := range sandbox.RuntimesDefault() {
		info := job.RuntimeInfo{Name: rt, Image: "kiln.local/" + rt + ":latest", Digest: "sha256:" + strings.Repeat("ab", 32), Limits: job.DefaultPolicy()}
		if err := store.RegisterRuntime(ctx, info, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-api"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) })
	metrics, err := ktrace.NewMetrics(tel.MeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{"alice-key-0123456789": "alice", "bob-key-0123456789": "bob"}
	srv, err := producer.New(ctx, producer.Config{Store: store, NATS: nc, APIKeys: keys, Metrics: metrics,
		QueueDepthInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler())
	mux.Handle("/", srv.Handler())
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)

	desired := func(backlog map[string]float64) int {
		t.Helper()
		n := int(*so.Spec.MinReplicaCount)
		for _, tr := range so.Spec.Triggers {
			threshold, err := strconv.ParseFloat(tr.Metadata["threshold"], 64)
			if err != nil {
				t.Fatalf("trigger %s: threshold: %v", tr.Name, err)
			}
			n = max(n, int(math.Ceil(backlog[tr.Name]/threshold)))
		}
		return min(n, int(*so.Spec.MaxReplicaCount))
	}

	submit := func(key, rt string, n int) {
		for i := range n {
			body := fmt.Sprintf(`{"runtime":%q,"code":"print(%d)"}`, rt, i)
			req, _ := http.NewRequest(http.MethodPost, api.URL+"/v1/jobs", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("submit %s for %s: %d %s", rt, keys[key], resp.StatusCode, b)
			}
		}
	}
	submit("alice-key-0123456789", "python", 10)
	submit("bob-key-0123456789", "python", 7)
	submit("bob-key-0123456789", "node", 2)

	backlog := queueBacklog(t, nc)
	if backlog["python"] != 17 || backlog["node"] != 2 {
		t.Fatalf("JetStream backlog %v; want python 17 and node 2", backlog)
	}
	// The API polls the queue: wait for a scrape that agrees.
	var read map[string]float64
	var page string
	if !testkit.Poll(10*time.Second, func() bool {
		read = map[string]float64{}
		page = scrape(t, api.URL+"/metrics")
		agree := true
		for _, tr := range so.Spec.Triggers {
			read[tr.Name] = evalQuery(t, tr.Metadata["query"], page)
			agree = agree && read[tr.Name] == backlog[tr.Name]
		}
		return agree
	}) {
		t.Fatalf("the triggers read %v; JetStream holds %v\n%s", read, backlog, grepLines(page, ktrace.MetricQueuePending))
	}
	if got := desired(read); got != 3 { // python: 17 waiting / 8 per worker
		t.Fatalf("KEDA would run %d workers for triggers reading %v; want 3", got, read)
	}
	t.Logf("triggers read %v; KEDA asks for %d workers", read, desired(read))
}

// queueBacklog is the jobs waiting per runtime, as JetStream itself counts
// them: the messages on each runtime's tenant subjects of the job stream.
func queueBacklog(t *testing.T, nc *nats.Conn) map[string]float64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(job.SubjectPrefix+">"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for subj, n := range info.State.Subjects {
		for _, rt := range sandbox.RuntimesDefault() {
			if job.IsTenantJobSubject(rt, subj) {
				out[rt] += float64(n)
			}
		}
	}
	return out
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// queryForm is the one PromQL form the triggers use: max over one metric's
// series with one label equal to a value.
var queryForm = regexp.MustCompile(`^max\(([a-zA-Z_:][a-zA-Z0-9_:]*)\{([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"\}\)$`)

// evalQuery evaluates query over a Prometheus text exposition. No series
// is PromQL's empty result, which the triggers' ignoreNullValues reads as 0.
func evalQuery(t *testing.T, query, page string) float64 {
	t.Helper()
	q := queryForm.FindStringSubmatch(query)
	if q == nil {
		t.Fatalf("query %q is not of the form max(metric{label=\"value\"})", query)
	}
	name, matcher := q[1], q[2]+"="+strconv.Quote(q[3])
	result, found := 0.0, false
	for _, line := range strings.Split(page, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !containsLabel(labels, matcher) {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("series %q: %v", line, err)
		}
		if !found || v > result {
			result, found = v, true
		}
	}
	return result
}

func containsLabel(labels, matcher string) bool {
	for _, l := range strings.Split(labels, ",") {
		if l == matcher {
			return true
		}
	}
	return false
}

func grepLines(page, prefix string) string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
