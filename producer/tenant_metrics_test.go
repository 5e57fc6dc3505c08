package producer

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	ktrace "github.com/kilnrun/kiln/trace"
)

func TestSubmissionsAndQuotaRefusalsAreCountedPerTenant(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	tm, err := ktrace.NewTenantMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, withQuota(Quota{SubmissionsPerSecond: 0.01, Burst: 2}), func(c *Config) {
		c.TenantMetrics, c.MetricsTenants = tm, 2 // alice, bob; carol is "other"
	})
	accepted(t, b.submit(t, `{"code":"print(1)"}`, as(aliceKey)...))
	accepted(t, b.submit(t, `{"code":"print(1)"}`, as(aliceKey)...)) // coalesced
	b.submit(t, `{"code":"print(1)"}`, as(aliceKey)...)              // over the rate
	accepted(t, b.submit(t, `{"code":"print(2)"}`, as(carolKey)...))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				key := mt.Name
				for _, k := range []attribute.Key{ktrace.TenantKey, ktrace.OutcomeKey, ktrace.QuotaKey} {
					if v, ok := dp.Attributes.Value(k); ok {
						key += "/" + v.AsString()
					}
				}
				got[key] += dp.Value
			}
		}
	}
	for key, want := range map[string]int64{
		ktrace.MetricTenantSubmissions + "/alice/queued":                   1,
		ktrace.MetricTenantSubmissions + "/alice/coalesced":                1,
		ktrace.MetricTenantSubmissions + "/alice/refused":                  1,
		ktrace.MetricTenantQuotaRefusals + "/alice/submissions_per_second": 1,
		ktrace.MetricTenantSubmissions + "/" + otherTenant + "/queued":     1,
	} {
		if got[key] != want {
			t.Errorf("%s = %d, want %d (all: %v)", key, got[key], want, got)
		}
	}
}
