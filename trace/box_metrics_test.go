package trace

import "testing"

// The boxes' and the pool's figures reach /metrics under their documented
// names and labels, as the worker reports them at each scrape, and stop
// being reported once unregistered.
func TestBoxAndPoolMetricsScrape(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{ServiceName: "kiln-worker"})
	m, err := NewMetrics(p.MeterProvider())
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	boxes, err := m.RegisterBoxes(func() BoxFigures {
		return BoxFigures{Idle: 2, Neutral: 1, Live: 4, Hits: 40, Claims: 3, Misses: 1, Retired: 5, Prepared: 37, Discarded: 2}
	})
	if err != nil {
		t.Fatalf("RegisterBoxes: %v", err)
	}
	pool, err := m.RegisterPool(func() []PoolFigures {
		return []PoolFigures{{Runtime: "node", Idle: 3, Target: 4, MemoryBytes: 3 << 20, Hits: 9, Misses: 2, Refills: 11, RefillSeconds: 1.5}}
	})
	if err != nil {
		t.Fatalf("RegisterPool: %v", err)
	}
	fams := scrape(t, p.MetricsHandler())
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kiln_boxes_idle", nil, 2},
		{"kiln_boxes_neutral", nil, 1},
		{"kiln_boxes_live", nil, 4},
		{"kiln_box_jobs_total", map[string]string{"kiln_box_meet": "hit"}, 40},
		{"kiln_box_jobs_total", map[string]string{"kiln_box_meet": "claim"}, 3},
		{"kiln_box_jobs_total", map[string]string{"kiln_box_meet": "miss"}, 1},
		{"kiln_boxes_retired_total", nil, 5},
		{"kiln_box_sandboxes_ahead_total", map[string]string{"kiln_box_ahead": "used"}, 37},
		{"kiln_box_sandboxes_ahead_total", map[string]string{"kiln_box_ahead": "discarded"}, 2},
		{"kiln_pool_idle", map[string]string{"kiln_runtime": "node"}, 3},
		{"kiln_pool_target", map[string]string{"kiln_runtime": "node"}, 4},
		{"kiln_pool_hits_total", map[string]string{"kiln_runtime": "node"}, 9},
		{"kiln_pool_misses_total", map[string]string{"kiln_runtime": "node"}, 2},
		{"kiln_pool_refills_total", map[string]string{"kiln_runtime": "node"}, 11},
	} {
		s := series(t, fams, c.name, c.labels)
		got := s.GetGauge().GetValue()
		if s.GetCounter() != nil {
			got = s.GetCounter().GetValue()
		}
		if got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	if err := boxes.Unregister(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Unregister(); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, p.MetricsHandler())
	for _, name := range []string{"kiln_boxes_live", "kiln_pool_idle"} {
		if _, ok := fams[name]; ok {
			t.Errorf("%s still reported after Unregister", name)
		}
	}
}
