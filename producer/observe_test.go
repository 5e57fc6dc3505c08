package producer

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// points flattens every int64/float64 data point of metric name to
// "attr=value,..." -> value (histograms: their count).
func points(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	key := func(s attribute.Set) string {
		out := ""
		for _, kv := range s.ToSlice() {
			out += fmt.Sprintf("%s=%s,", kv.Key, kv.Value.Emit())
		}
		return out
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[key(p.Attributes)] += float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[key(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[key(p.Attributes)] += float64(p.Count)
				}
			}
		}
	}
	return got
}

// Operator metrics: requests and latencies by route pattern and status,
// 503s counted as rejections, and the queue gauges (stream messages,
// consumer pending) that autoscaling reads.
func TestOperatorMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := ktrace.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, func(c *Config) { c.Metrics = m })
	for i := range 3 {
		if r := b.do(t, http.MethodPost, "/v1/jobs", fmt.Sprintf(`{"runtime":"python","code":"print(%d)"}`, i)); r.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d %s", r.StatusCode, r.body)
		}
	}
	b.do(t, http.MethodGet, "/v1/jobs/"+job.NewID(), "")
	b.redis.Stop()
	if r := b.do(t, http.MethodPost, "/v1/jobs", `{"runtime":"python","code":"print(9)"}`); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("submit with redis down: %d %s", r.StatusCode, r.body)
	}

	b.do(t, http.MethodGet, "/v2/nothing", "")
	reqs := points(t, reader, ktrace.MetricHTTPRequests)
	t.Logf("requests: %v", reqs)
	// A route is a path: the method is a label of its own, never in it.
	for k := range reqs {
		if strings.Contains(k, "http.route=GET ") || strings.Contains(k, "http.route=POST ") || strings.Contains(k, "http.route=/,") {
			t.Errorf("%s: a route with a method, or an unrouted path as /", k)
		}
	}
	if reqs["http.request.method=GET,http.response.status_code=404,http.route=unmatched,"] != 1 {
		t.Errorf("a path of no route is not counted as unmatched: %v", reqs)
	}
	for k, want := range map[string]float64{
		"http.request.method=POST,http.response.status_code=202,http.route=/v1/jobs,":     3,
		"http.request.method=GET,http.response.status_code=404,http.route=/v1/jobs/{id},": 1,
		"http.request.method=POST,http.response.status_code=503,http.route=/v1/jobs,":     1,
	} {
		if reqs[k] != want {
			t.Errorf("%s{%s} = %v, want %v", ktrace.MetricHTTPRequests, k, reqs[k], want)
		}
	}
	if lat := points(t, reader, ktrace.MetricHTTPDuration); len(lat) < 3 {
		t.Errorf("latency series: %v", lat)
	}
	rej := points(t, reader, ktrace.MetricHTTPRejected)
	t.Logf("rejected: %v", rej)
	if total(rej) != 1 {
		t.Errorf("%s = %v, want one 503", ktrace.MetricHTTPRejected, rej)
	}

	// The gauges come from a poll every 5 s.
	var msgs, pending map[string]float64
	if !testkit.Poll(3*queueDepthInterval, func() bool {
		msgs, pending = points(t, reader, ktrace.MetricQueueMessages), points(t, reader, ktrace.MetricQueuePending)
		return total(msgs) == 3 && total(pending) == 3
	}) {
		t.Fatalf("queue gauges: messages %v pending %v, want 3 and 3", msgs, pending)
	}
	t.Logf("queue: messages %v pending %v ack-pending %v", msgs, pending, points(t, reader, ktrace.MetricQueueAckPending))
}

func total(m map[string]float64) float64 {
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}

// With jobs waiting for two tenants, the queue depth of the runtime is the
// whole backlog, under the runtime's name alone: tenants' backlogs are
// summed, and no tenant token reaches the runtime label.
func TestQueueDepthSumsTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{aliceKey: "alice", bobKey: "bob"}
	})
	ctx := context.Background()
	// A consumer on the job stream that is no runtime's (an operator's
	// tool) is left out.
	if _, err := b.js.CreateOrUpdateConsumer(ctx, job.StreamName, jetstreamConsumer("inspector", job.SubjectPrefix+"inspect.x")); err != nil {
		t.Fatal(err)
	}
	submit := func(key string, n int) {
		for i := range n {
			r := b.do(t, http.MethodPost, "/v1/jobs", fmt.Sprintf(`{"runtime":"python","code":"print(%d, %d)"}`, len(key), i), "Authorization", "Bearer "+key)
			accepted(t, r)
		}
	}
	submit(aliceKey, 3)
	submit(bobKey, 2)

	d, err := b.srv.queue.queueDepth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Consumers) != 1 || d.Consumers["python"].Pending != 5 {
		t.Fatalf("queue depth by runtime %+v; want python: 5 pending", d.Consumers)
	}
	if d.Messages != 5 {
		t.Fatalf("stream messages %d, want 5", d.Messages)
	}
}

func jetstreamConsumer(name, filter string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy}
}
