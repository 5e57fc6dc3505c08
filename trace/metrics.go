package trace

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// Instrument names. The Prometheus exporter appends the unit and _total, so
// kiln_jobs_submitted is scraped as kiln_jobs_submitted_total and
// kiln_queue_wait_duration as kiln_queue_wait_duration_seconds.
const (
	MetricJobsSubmitted         = "kiln_jobs_submitted"
	MetricJobsFinished          = "kiln_jobs_finished"
	MetricQueueWait             = "kiln_queue_wait_duration"
	MetricExecution             = "kiln_execution_duration"
	MetricEndToEnd              = "kiln_job_e2e_duration"
	MetricCacheHits             = "kiln_cache_hits"
	MetricCacheMisses           = "kiln_cache_misses"
	MetricSlotsBusy             = "kiln_worker_slots_busy"
	MetricSlotsFree             = "kiln_worker_slots_free"
	MetricRedeliveries          = "kiln_redeliveries"
	MetricOOMKills              = "kiln_oom_kills"
	MetricTimeouts              = "kiln_timeouts"
	MetricSandboxCreateFailures = "kiln_sandbox_create_failures"
	MetricSandboxUp             = "kiln_worker_sandbox_up"
)

// LatencyBuckets are the histogram boundaries, in seconds, of every Kiln
// duration: from 1 ms (a cache hit, a warm start) to 5 min (the longest
// timeout job.MaxLimits allows), roughly 2.5× apart.
var LatencyBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300,
}

// Metrics records Kiln's service-level measurements. Every method is safe for
// concurrent use, and a nil *Metrics records nothing, so a component built
// without metrics needs no special case.
type Metrics struct {
	meter metric.Meter

	submitted, finished          metric.Int64Counter
	queueWait, execution, e2e    metric.Float64Histogram
	cacheHits, cacheMisses       metric.Int64Counter
	slotsBusy, slotsFree         metric.Int64ObservableGauge
	sandboxUp                    metric.Int64ObservableGauge
	redeliveries, oomKills       metric.Int64Counter
	timeouts, sandboxCreateFails metric.Int64Counter
	ops                          *opsInstruments // operator metrics: ops_metrics.go
}

// NewMetrics creates Kiln's instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := &Metrics{meter: mp.Meter(instrumentationName)}
	var err error
	counter := func(dst *metric.Int64Counter, name, unit, desc string) {
		if err == nil {
			*dst, err = m.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
			if err != nil {
				err = fmt.Errorf("create counter %s: %w", name, err)
			}
		}
	}
	histogram := func(dst *metric.Float64Histogram, name, desc string) {
		if err == nil {
			*dst, err = m.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
				metric.WithExplicitBucketBoundaries(LatencyBuckets...))
			if err != nil {
				err = fmt.Errorf("create histogram %s: %w", name, err)
			}
		}
	}
	gauge := func(dst *metric.Int64ObservableGauge, name, desc string) {
		if err == nil {
			*dst, err = m.meter.Int64ObservableGauge(name, metric.WithUnit("{slot}"), metric.WithDescription(desc))
			if err != nil {
				err = fmt.Errorf("create gauge %s: %w", name, err)
			}
		}
	}
	counter(&m.submitted, MetricJobsSubmitted, "{job}", "Jobs accepted by the API, by runtime.")
	counter(&m.finished, MetricJobsFinished, "{job}", "Jobs that reached a terminal status, by runtime and status.")
	histogram(&m.queueWait, MetricQueueWait, "Time from submission until a worker took the job.")
	histogram(&m.execution, MetricExecution, "Time a worker spent running the job, sandbox set-up included.")
	histogram(&m.e2e, MetricEndToEnd, "Time from submission until the result was stored.")
	counter(&m.cacheHits, MetricCacheHits, "{job}", "Submissions answered from the result cache.")
	counter(&m.cacheMisses, MetricCacheMisses, "{job}", "Submissions not found in the result cache.")
	gauge(&m.slotsBusy, MetricSlotsBusy, "Worker slots running a job.")
	gauge(&m.slotsFree, MetricSlotsFree, "Worker slots waiting for a job.")
	gauge(&m.sandboxUp, MetricSandboxUp, "1 while the worker's sandbox backend (containerd) answers, 0 while it does not and the worker pulls no job.")
	counter(&m.redeliveries, MetricRedeliveries, "{delivery}", "Jobs delivered again after a worker failed to ack them.")
	counter(&m.oomKills, MetricOOMKills, "{job}", "Sandboxes killed for exceeding their memory limit.")
	counter(&m.timeouts, MetricTimeouts, "{job}", "Sandboxes killed at their wall-clock timeout.")
	counter(&m.sandboxCreateFails, MetricSandboxCreateFailures, "{sandbox}", "Sandboxes that could not be created or started.")
	if err == nil {
		m.ops, err = newOpsInstruments(m.meter)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// JobSubmitted counts a job the API accepted.
func (m *Metrics) JobSubmitted(ctx context.Context, runtime string) {
	if m == nil {
		return
	}
	m.submitted.Add(ctx, 1, metric.WithAttributes(RuntimeKey.String(runtime)))
}

// JobFinished counts a job that reached a terminal status and records how long
// it ran (exec) and how long it took from submission (e2e). A zero exec, for
// a job that never ran (cache hit, canceled while queued), is not recorded as
// an execution time.
func (m *Metrics) JobFinished(ctx context.Context, runtime, status string, exec, e2e time.Duration) {
	if m == nil {
		return
	}
	rt := RuntimeKey.String(runtime)
	m.finished.Add(ctx, 1, metric.WithAttributes(rt, StatusKey.String(status)))
	if exec > 0 {
		m.execution.Record(ctx, exec.Seconds(), metric.WithAttributes(rt))
	}
	if e2e > 0 {
		m.e2e.Record(ctx, e2e.Seconds(), metric.WithAttributes(rt))
	}
}

// QueueWait records how long a job waited between submission and a worker
// taking it.
func (m *Metrics) QueueWait(ctx context.Context, runtime string, wait time.Duration) {
	if m == nil {
		return
	}
	m.queueWait.Record(ctx, max(wait, 0).Seconds(), metric.WithAttributes(RuntimeKey.String(runtime)))
}

// CacheHit counts a submission answered from the result cache.
func (m *Metrics) CacheHit(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.cacheHits, runtime)
	}
}

// CacheMiss counts a submission the result cache could not answer.
func (m *Metrics) CacheMiss(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.cacheMisses, runtime)
	}
}

// Redelivered counts a delivery of a job that had been delivered before.
func (m *Metrics) Redelivered(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.redeliveries, runtime)
	}
}

// OOMKilled counts a sandbox killed by the kernel for exceeding its memory limit.
func (m *Metrics) OOMKilled(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.oomKills, runtime)
	}
}

// TimedOut counts a sandbox killed at its wall-clock timeout.
func (m *Metrics) TimedOut(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.timeouts, runtime)
	}
}

// SandboxCreateFailed counts a sandbox that could not be created or started.
func (m *Metrics) SandboxCreateFailed(ctx context.Context, runtime string) {
	if m != nil {
		m.count(ctx, m.sandboxCreateFails, runtime)
	}
}

// RegisterSlots makes slots the source of the busy and free slot gauges; the
// meter calls it at each scrape, so the worker reports its state without
// pushing updates. Unregister the returned registration when the worker stops.
func (m *Metrics) RegisterSlots(slots func() (busy, free int64)) (metric.Registration, error) {
	if m == nil || slots == nil {
		return noopRegistration{}, nil
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		busy, free := slots()
		o.ObserveInt64(m.slotsBusy, busy)
		o.ObserveInt64(m.slotsFree, free)
		return nil
	}, m.slotsBusy, m.slotsFree)
	if err != nil {
		return nil, fmt.Errorf("register slot gauges: %w", err)
	}
	return reg, nil
}

// RegisterSandboxUp makes up the source of the sandbox backend gauge (1 up,
// 0 down), read at each scrape. Unregister it when the worker stops.
func (m *Metrics) RegisterSandboxUp(up func() bool) (metric.Registration, error) {
	if m == nil || up == nil {
		return noopRegistration{}, nil
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if up() {
			v = 1
		}
		o.ObserveInt64(m.sandboxUp, v)
		return nil
	}, m.sandboxUp)
	if err != nil {
		return nil, fmt.Errorf("register sandbox gauge: %w", err)
	}
	return reg, nil
}

func (m *Metrics) count(ctx context.Context, c metric.Int64Counter, runtime string) {
	c.Add(ctx, 1, metric.WithAttributes(RuntimeKey.String(runtime)))
}

type noopRegistration struct{ metric.Registration }

func (noopRegistration) Unregister() error { return nil }
