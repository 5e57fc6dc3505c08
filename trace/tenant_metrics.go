package trace

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// Per-tenant instrument names (scraped with _total appended).
const (
	MetricTenantSubmissions   = "kiln_tenant_submissions"
	MetricTenantQuotaRefusals = "kiln_tenant_quota_refusals"
)

// Per-tenant attribute keys. The API keeps the tenant label's values
// bounded: tenants beyond its configured cap are counted as "other".
const (
	TenantKey  = attribute.Key("kiln.tenant")
	OutcomeKey = attribute.Key("kiln.outcome")
	QuotaKey   = attribute.Key("kiln.quota")
)

// TenantMetrics counts the API's work per tenant. A nil *TenantMetrics
// records nothing.
type TenantMetrics struct {
	submissions, refusals metric.Int64Counter
}

// NewTenantMetrics creates the per-tenant instruments on mp.
func NewTenantMetrics(mp metric.MeterProvider) (*TenantMetrics, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	meter := mp.Meter(instrumentationName)
	var m TenantMetrics
	var err error
	if m.submissions, err = meter.Int64Counter(MetricTenantSubmissions, metric.WithUnit("{job}"),
		metric.WithDescription("Job submissions per tenant, by outcome: queued, cache_hit, coalesced, replayed (Idempotency-Key) or refused (over a quota).")); err != nil {
		return nil, fmt.Errorf("create counter %s: %w", MetricTenantSubmissions, err)
	}
	if m.refusals, err = meter.Int64Counter(MetricTenantQuotaRefusals, metric.WithUnit("{request}"),
		metric.WithDescription("Submissions refused with 429 per tenant and quota.")); err != nil {
		return nil, fmt.Errorf("create counter %s: %w", MetricTenantQuotaRefusals, err)
	}
	return &m, nil
}

// Submission counts one submission of tenant with its outcome.
func (m *TenantMetrics) Submission(ctx context.Context, tenant, outcome string) {
	if m == nil {
		return
	}
	m.submissions.Add(ctx, 1, metric.WithAttributes(TenantKey.String(tenant), OutcomeKey.String(outcome)))
}

// QuotaRefused counts a submission of tenant refused by quota.
func (m *TenantMetrics) QuotaRefused(ctx context.Context, tenant, quota string) {
	if m == nil {
		return
	}
	m.refusals.Add(ctx, 1, metric.WithAttributes(TenantKey.String(tenant), QuotaKey.String(quota)))
}
