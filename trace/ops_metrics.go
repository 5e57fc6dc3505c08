package trace

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Operator metrics: what an operator scales and alerts on (queue depth,
// HTTP traffic and rejections) and what the fleet's fault handling did.
const (
	MetricQueuePending     = "kiln_queue_pending"     // jobs waiting for a worker, by runtime
	MetricQueueAckPending  = "kiln_queue_ack_pending" // delivered, not yet acked, by runtime
	MetricQueueRedelivered = "kiln_queue_redelivered" // being redelivered now, by runtime
	MetricQueueMessages    = "kiln_queue_messages"    // jobs in the queue, waiting or running
	MetricHTTPRequests     = "kiln_http_requests"     // by route pattern, method and status
	MetricHTTPDuration     = "kiln_http_request_duration"
	MetricHTTPRejected     = "kiln_http_rejected" // 429 and 503 answers, by route and status
	MetricRecordsRestored  = "kiln_records_restored"
	MetricOrphansReaped    = "kiln_orphans_reaped"
	MetricJobsRepublished  = "kiln_jobs_republished"
)

// Attribute keys of the operator metrics.
var (
	HTTPRouteKey  = attribute.Key("http.route")
	HTTPMethodKey = attribute.Key("http.request.method")
	HTTPStatusKey = attribute.Key("http.response.status_code")
)

type opsInstruments struct {
	pending, ackPending, redelivered, messages metric.Int64ObservableGauge
	requests, rejected                         metric.Int64Counter
	duration                                   metric.Float64Histogram
	restored, reaped, republished              metric.Int64Counter
}

func newOpsInstruments(m metric.Meter) (*opsInstruments, error) {
	o := &opsInstruments{}
	var err error
	gauge := func(dst *metric.Int64ObservableGauge, name, unit, desc string) {
		if err == nil {
			if *dst, err = m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc)); err != nil {
				err = fmt.Errorf("create gauge %s: %w", name, err)
			}
		}
	}
	counter := func(dst *metric.Int64Counter, name, unit, desc string) {
		if err == nil {
			if *dst, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc)); err != nil {
				err = fmt.Errorf("create counter %s: %w", name, err)
			}
		}
	}
	gauge(&o.pending, MetricQueuePending, "{job}", "Jobs waiting in the queue for a worker (in their tenants' backlogs, or taken for a slot and not yet delivered), by runtime.")
	gauge(&o.ackPending, MetricQueueAckPending, "{job}", "Jobs delivered to a worker and not yet acknowledged, by runtime.")
	gauge(&o.redelivered, MetricQueueRedelivered, "{job}", "Jobs delivered more than once and not yet acknowledged, by runtime.")
	gauge(&o.messages, MetricQueueMessages, "{message}", "Jobs in the queue, waiting or running (not yet acknowledged).")
	counter(&o.requests, MetricHTTPRequests, "{request}", "HTTP requests answered, by route pattern, method and status.")
	counter(&o.rejected, MetricHTTPRejected, "{request}", "HTTP requests answered 429 (queue full) or 503 (a dependency unavailable).")
	if err == nil {
		o.duration, err = m.Float64Histogram(MetricHTTPDuration, metric.WithUnit("s"),
			metric.WithDescription("Time to answer an HTTP request, by route pattern, method and status."),
			metric.WithExplicitBucketBoundaries(LatencyBuckets...))
	}
	counter(&o.restored, MetricRecordsRestored, "{job}", "Job records the store had lost, recreated by a worker from the job message.")
	counter(&o.reaped, MetricOrphansReaped, "{sandbox}", "Sandboxes removed because the worker that started them is gone.")
	counter(&o.republished, MetricJobsRepublished, "{job}", "Jobs published again because their first publish was not confirmed.")
	if err != nil {
		return nil, err
	}
	return o, nil
}

// HTTPRequest records one answered request. route is the mux pattern
// ("GET /v1/jobs/{id}"), never the raw path, so ids do not explode the series.
func (m *Metrics) HTTPRequest(ctx context.Context, route, method string, status int, took time.Duration) {
	if m == nil {
		return
	}
	attrs := metric.WithAttributes(HTTPRouteKey.String(route), HTTPMethodKey.String(method), HTTPStatusKey.Int(status))
	m.ops.requests.Add(ctx, 1, attrs)
	m.ops.duration.Record(ctx, took.Seconds(), attrs)
	if status == 429 || status == 503 {
		m.ops.rejected.Add(ctx, 1, metric.WithAttributes(HTTPRouteKey.String(route), HTTPStatusKey.String(strconv.Itoa(status))))
	}
}

// RecordRestored counts a job record recreated from its message.
func (m *Metrics) RecordRestored(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.ops.restored, runtime)
	}
}

// OrphanReaped counts a sandbox removed because its worker is gone.
func (m *Metrics) OrphanReaped(ctx context.Context, n int) {
	if m != nil && n > 0 {
		m.ops.reaped.Add(ctx, int64(n))
	}
}

// JobRepublished counts a job published again.
func (m *Metrics) JobRepublished(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.ops.republished, runtime)
	}
}

// QueueDepth is one poll of the queue: per runtime figures and the jobs in
// the queue.
type QueueDepth struct {
	Consumers map[string]ConsumerDepth // by runtime
	Messages  int64
}

// ConsumerDepth is one runtime's figures: jobs waiting, delivered and not
// yet acknowledged, and delivered more than once.
type ConsumerDepth struct {
	Pending, AckPending, Redelivered int64
}

// RegisterQueueDepth makes depth the source of the queue gauges; the meter
// calls it at each scrape. depth returns the latest poll (cheap: it must
// not call NATS itself) and false when there is none yet.
func (m *Metrics) RegisterQueueDepth(depth func() (QueueDepth, bool)) (metric.Registration, error) {
	if m == nil || depth == nil {
		return noopRegistration{}, nil
	}
	o := m.ops
	reg, err := m.meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		d, ok := depth()
		if !ok {
			return nil
		}
		for rt, c := range d.Consumers {
			a := metric.WithAttributes(RuntimeKey.String(rt))
			obs.ObserveInt64(o.pending, c.Pending, a)
			obs.ObserveInt64(o.ackPending, c.AckPending, a)
			obs.ObserveInt64(o.redelivered, c.Redelivered, a)
		}
		obs.ObserveInt64(o.messages, d.Messages)
		return nil
	}, o.pending, o.ackPending, o.redelivered, o.messages)
	if err != nil {
		return nil, fmt.Errorf("register queue gauges: %w", err)
	}
	return reg, nil
}
