package trace

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// Metric names of the worker's boxes (long-lived containers each job gets a
// fresh inner sandbox of).
const (
	MetricBoxesIdle    = "kiln_boxes_idle"
	MetricBoxesNeutral = "kiln_boxes_neutral"
	MetricBoxesLive    = "kiln_boxes_live"
	MetricBoxesJobs    = "kiln_box_jobs"
	MetricBoxesRetired = "kiln_boxes_retired"
	MetricBoxesAhead   = "kiln_box_sandboxes_ahead"
)

// BoxFigures are the boxes' figures at a scrape (the sandbox runtime's
// BoxStats, without this package importing it).
type BoxFigures struct {
	Idle, Neutral, Live           int64
	Hits, Claims, Misses, Retired int64
	// Inner sandboxes made ahead of a job while their box was idle: used
	// by the job that came (Prepared), or discarded (Discarded: it had
	// other limits or a network).
	Prepared, Discarded int64
}

// RegisterBoxes makes figures the source of the boxes' gauges and counters;
// the meter calls it at each scrape. Unregister the returned registration
// when the worker stops.
func (m *Metrics) RegisterBoxes(figures func() BoxFigures) (metric.Registration, error) {
	if m == nil || figures == nil {
		return noopRegistration{}, nil
	}
	var err error
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, e := m.meter.Int64ObservableGauge(name, metric.WithUnit("{box}"), metric.WithDescription(desc))
		err = errorsJoin(err, e)
		return g
	}
	idle := gauge(MetricBoxesIdle, "Boxes waiting for their tenant's next job.")
	neutral := gauge(MetricBoxesNeutral, "Boxes ready that no tenant has used yet.")
	live := gauge(MetricBoxesLive, "Boxes this worker holds, idle or busy.")
	jobs, e := m.meter.Int64ObservableCounter(MetricBoxesJobs, metric.WithUnit("{job}"),
		metric.WithDescription("Jobs by how they met a box: hit (their tenant's idle box), claim (a neutral one), miss (none: a container of their own)."))
	err = errorsJoin(err, e)
	retired, e := m.meter.Int64ObservableCounter(MetricBoxesRetired, metric.WithUnit("{box}"), metric.WithDescription("Boxes retired."))
	err = errorsJoin(err, e)
	ahead, e := m.meter.Int64ObservableCounter(MetricBoxesAhead, metric.WithUnit("{sandbox}"),
		metric.WithDescription("Inner sandboxes made ahead of a job while their box was idle, by use: used (the job that came took it) or discarded (it had other limits or a network)."))
	err = errorsJoin(err, e)
	if err != nil {
		return nil, fmt.Errorf("create box instruments: %w", err)
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		f := figures()
		o.ObserveInt64(idle, f.Idle)
		o.ObserveInt64(neutral, f.Neutral)
		o.ObserveInt64(live, f.Live)
		for _, x := range []struct {
			how string
			n   int64
		}{{"hit", f.Hits}, {"claim", f.Claims}, {"miss", f.Misses}} {
			o.ObserveInt64(jobs, x.n, metric.WithAttributes(BoxMeetKey.String(x.how)))
		}
		o.ObserveInt64(retired, f.Retired)
		o.ObserveInt64(ahead, f.Prepared, metric.WithAttributes(BoxAheadKey.String("used")))
		o.ObserveInt64(ahead, f.Discarded, metric.WithAttributes(BoxAheadKey.String("discarded")))
		return nil
	}, idle, neutral, live, jobs, retired, ahead)
	if err != nil {
		return nil, fmt.Errorf("register box instruments: %w", err)
	}
	return reg, nil
}
