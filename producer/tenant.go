package producer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// MetricsTenantsDefault is the default of Config.MetricsTenants.
const MetricsTenantsDefault = 50

// otherTenant is the metric label of tenants beyond Config.MetricsTenants.
const otherTenant = "other"

// Tenant is one tenant's settings, as the API key file sets them. Every API
// key is a tenant, named by the key's name; several keys with one name are
// one tenant (key rotation).
type Tenant struct {
	// Quota bounds what the tenant may use. Zero fields are unlimited.
	Quota Quota
	// CacheGroup, when set, makes the tenant share its result cache with
	// every tenant naming the same group: a result one of them ran answers
	// identical jobs of the others. Jobs, in-flight runs and Idempotency-Keys
	// stay per tenant. Default: a cache of its own.
	CacheGroup string
	// Recycle lets the tenant's jobs run in recycled sandboxes: one
	// container serving the tenant's jobs one after another, each forked
	// fresh from a preloaded interpreter, with what a job leaves behind
	// wiped between them (never shared with another tenant). Faster; the
	// README's security model says what it does not separate. Default: off.
	Recycle bool
}

// Quota is a tenant's quotas. Zero means unlimited.
type Quota struct {
	// MaxQueued bounds the tenant's jobs waiting in the queue (not running);
	// a submission over it is refused with 429 (job.QuotaQueued).
	MaxQueued int64
	// MaxRunning bounds the tenant's jobs running at once across the whole
	// fleet; more wait in the queue (job.QuotaRunning). It is the
	// tenant's JetStream consumer's MaxAckPending.
	MaxRunning int64
	// SubmissionsPerSecond is the refill rate of a token bucket of Burst
	// tokens; a submission over it is refused with 429 (job.QuotaRate).
	// Cache hits and coalesced submissions count too: each is a request.
	SubmissionsPerSecond float64
	// Burst is the bucket size. Default: max(1, ceil(SubmissionsPerSecond)).
	Burst int64
	// CPUSecondsPerDay bounds the CPU time the tenant's jobs use per UTC day,
	// charged as each job ends; once reached, submissions are refused with
	// 429 (job.QuotaCPUDay) until the next UTC midnight. A job that starts
	// under the quota may end over it.
	CPUSecondsPerDay int64
}

// Validate reports a quota that makes no sense.
func (t Tenant) Validate() error {
	q := t.Quota
	switch {
	case q.MaxQueued < 0, q.MaxRunning < 0, q.Burst < 0, q.CPUSecondsPerDay < 0:
		return errors.New("quotas must not be negative")
	case q.SubmissionsPerSecond < 0 || math.IsNaN(q.SubmissionsPerSecond) || math.IsInf(q.SubmissionsPerSecond, 0):
		return fmt.Errorf("submissions per second %v must be a positive number", q.SubmissionsPerSecond)
	case q.MaxRunning > math.MaxInt32:
		return fmt.Errorf("max running %d is too large", q.MaxRunning)
	}
	return nil
}

func (q Quota) burst() int64 {
	if q.Burst > 0 {
		return q.Burst
	}
	return max(1, int64(math.Ceil(q.SubmissionsPerSecond)))
}

// tenant returns the settings of the named tenant (zero when not listed).
func (s *Server) tenant(name string) Tenant { return s.cfg.Tenants[name] }

// cacheScope is the result-cache scope of a tenant's jobs.
func (s *Server) cacheScope(name string) string {
	if g := s.tenant(name).CacheGroup; g != "" {
		return "group:" + g
	}
	return "tenant:" + name
}

// tenantOf is the tenant a record belongs to.
func tenantOf(rec *cache.Record) string { return rec.Message.TenantOrDefault() }

// tenantJob returns job id's record if it belongs to tenant, and
// cache.ErrNotFound otherwise: to another tenant a job is indistinguishable
// from one that never existed. Every per-job route looks jobs up here.
func (s *Server) tenantJob(ctx context.Context, tenant, id string) (cache.Record, error) {
	rec, err := s.store.GetJob(ctx, id)
	if err != nil {
		return rec, err
	}
	if tenantOf(&rec) != tenant {
		return cache.Record{}, fmt.Errorf("get job %s: %w", id, cache.ErrNotFound)
	}
	return rec, nil
}

// metricTenant is the label a tenant is counted under: its name for the
// first MetricsTenants tenants of the key file (by name), "other" beyond.
func (s *Server) metricTenant(name string) string {
	if _, ok := s.metricNames[name]; ok {
		return name
	}
	return otherTenant
}

// metricTenants picks the tenants named in metric labels: the dev-mode
// tenant and, sorted by name, at most MetricsTenants tenants of the key file.
func metricTenants(cfg Config) map[string]struct{} {
	names := map[string]struct{}{}
	for _, n := range cfg.APIKeys {
		names[n] = struct{}{}
	}
	for n := range cfg.Tenants {
		names[n] = struct{}{}
	}
	sorted := slices.Sorted(maps.Keys(names))
	out := map[string]struct{}{job.DefaultTenant: {}}
	for _, n := range sorted[:min(len(sorted), cfg.MetricsTenants)] {
		out[n] = struct{}{}
	}
	return out
}
