package trace

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// Metric names of the worker's warm pool of sandboxes, labelled by runtime.
const (
	MetricPoolIdle       = "kiln_pool_idle"
	MetricPoolTarget     = "kiln_pool_target"
	MetricPoolMemory     = "kiln_pool_memory"
	MetricPoolHits       = "kiln_pool_hits"
	MetricPoolMisses     = "kiln_pool_misses"
	MetricPoolRefills    = "kiln_pool_refills"
	MetricPoolRefillTime = "kiln_pool_refill_duration"
)

// PoolFigures are one runtime's pool figures at a scrape (the sandbox
// runtime's PoolStats, without this package importing it).
type PoolFigures struct {
	Runtime               string
	Idle, Target          int64
	MemoryBytes           int64
	Hits, Misses, Refills int64
	RefillSeconds         float64
}

// RegisterPool makes figures the source of the pool's gauges and counters;
// the meter calls it at each scrape. Unregister the returned registration
// when the worker stops.
func (m *Metrics) RegisterPool(figures func() []PoolFigures) (metric.Registration, error) {
	if m == nil || figures == nil {
		return noopRegistration{}, nil
	}
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, e := m.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errorsJoin(err, e)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, e := m.meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errorsJoin(err, e)
		return c
	}
	idle := gauge(MetricPoolIdle, "{sandbox}", "Pooled sandboxes waiting for a job, by runtime.")
	target := gauge(MetricPoolTarget, "{sandbox}", "Idle sandboxes the pool is filling towards, by runtime.")
	mem := gauge(MetricPoolMemory, "By", "Memory the idle pooled sandboxes hold, by runtime.")
	hits := counter(MetricPoolHits, "{job}", "Jobs served by a pooled sandbox, by runtime.")
	misses := counter(MetricPoolMisses, "{job}", "Jobs that found no pooled sandbox of their class, by runtime.")
	refills := counter(MetricPoolRefills, "{sandbox}", "Sandboxes prepared for the pool, by runtime.")
	refillTime, e := m.meter.Float64ObservableCounter(MetricPoolRefillTime, metric.WithUnit("s"),
		metric.WithDescription("Time spent preparing sandboxes for the pool, by runtime."))
	err = errorsJoin(err, e)
	if err != nil {
		return nil, fmt.Errorf("create pool instruments: %w", err)
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, f := range figures() {
			attrs := metric.WithAttributes(RuntimeKey.String(f.Runtime))
			o.ObserveInt64(idle, f.Idle, attrs)
			o.ObserveInt64(target, f.Target, attrs)
			o.ObserveInt64(mem, f.MemoryBytes, attrs)
			o.ObserveInt64(hits, f.Hits, attrs)
			o.ObserveInt64(misses, f.Misses, attrs)
			o.ObserveInt64(refills, f.Refills, attrs)
			o.ObserveFloat64(refillTime, f.RefillSeconds, attrs)
		}
		return nil
	}, idle, target, mem, hits, misses, refills, refillTime)
	if err != nil {
		return nil, fmt.Errorf("register pool instruments: %w", err)
	}
	return reg, nil
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
