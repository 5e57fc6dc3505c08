package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	ktrace "github.com/kilnrun/kiln/trace"
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
	// Bounds are the tenant's shares of the parts all tenants use.
	Bounds Bounds
	// Redact is how workers redact the tenant's output (key file: redact=,
	// redact_secret=, redact_pattern=); it rides on each job's message.
	// Default (nil): job.RedactOn with the built-in detectors only.
	Redact *job.RedactPolicy
	// DedicatedBoxes keeps the tenant's jobs to boxes that serve no other
	// tenant (key file: dedicated_boxes=true), where its policy asks for
	// it. Default: boxes serve every tenant, each job in a fresh inner
	// sandbox of its own (docs/decisions/boxes.md).
	DedicatedBoxes bool
	// Egress is the hosts the tenant's jobs may ask to reach (key file:
	// egress=api.example.org,*.data.gov:443); a job's "network.allow" must
	// stay within it (egressrule.Rules.Within), or the job is refused with
	// job.ProblemEgressNotAllowed. Default (none): no job of the tenant
	// gets a network.
	Egress egressrule.Rules
}

// Defaults of Bounds.
const (
	EventStreamsDefault       = 16
	EventStreamsPerJobDefault = 4
	StoredBytesDefault        = 1 << 30
	StoredObjectsDefault      = 10_000
)

// Bounds are a tenant's shares of the parts every tenant uses, so that no
// tenant can make them work against another. Unlike Quota, a zero field
// takes the default beside it: these are never unlimited.
type Bounds struct {
	// EventStreams bounds the tenant's event streams (GET
	// /v1/jobs/{id}/events) open at once on one API process; one more is
	// refused with 429 and Retry-After (job.QuotaEventStreams). Default
	// EventStreamsDefault (16).
	EventStreams int64
	// EventStreamsPerJob bounds the streams open at once on one job, on one
	// API process (job.QuotaEventStreamsPerJob). Default
	// EventStreamsPerJobDefault (4).
	EventStreamsPerJob int64
	// CallbackConcurrency bounds the tenant's callbacks being sent at once
	// by one deliverer; more wait their turn, so a receiver that hangs
	// delays only its own tenant. Read by the callback deliverer. Default
	// callback.TenantConcurrencyDefault (4).
	CallbackConcurrency int64
	// StoredBytes bounds the bytes the tenant's jobs put in the object
	// store (artifacts, and output too long to keep inline) over its
	// retention (blob.Config.TTL, 48h); a job whose output would pass it
	// fails as its own output_limit error naming job.QuotaStoredBytes.
	// Enforced by workers. Default StoredBytesDefault (1 GiB).
	StoredBytes int64
	// StoredObjects bounds the objects, likewise (job.QuotaStoredObjects).
	// Default StoredObjectsDefault (10,000).
	StoredObjects int64
	// AuditRecordsPerDay and AuditBytesPerDay bound what the tenant's
	// actions add to its audit log per UTC day: past either, its records
	// are not kept, and one record (kind audit_bound) says so once a day.
	// Counted in Redis by the API and the workers alike. Defaults
	// audit.RecordsPerDayDefault (100,000) and audit.BytesPerDayDefault
	// (64 MiB).
	AuditRecordsPerDay int64
	AuditBytesPerDay   int64
}

func (b Bounds) withDefaults() Bounds {
	b.EventStreams = cmp.Or(b.EventStreams, EventStreamsDefault)
	b.EventStreamsPerJob = cmp.Or(b.EventStreamsPerJob, EventStreamsPerJobDefault)
	b.StoredBytes = cmp.Or(b.StoredBytes, StoredBytesDefault)
	b.StoredObjects = cmp.Or(b.StoredObjects, StoredObjectsDefault)
	b.AuditRecordsPerDay = cmp.Or(b.AuditRecordsPerDay, audit.RecordsPerDayDefault)
	b.AuditBytesPerDay = cmp.Or(b.AuditBytesPerDay, audit.BytesPerDayDefault)
	return b
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
	// CPUSecondsPerDay bounds the CPU time the tenant's jobs use per UTC day.
	// A run reserves its CPU limit as it starts and is charged what it used
	// as it ends; a run whose limit the quota left cannot cover does not
	// start (it fails with job.CategoryQuota). Once the day's quota is used,
	// submissions are refused with 429 (job.QuotaCPUDay) until the next UTC
	// midnight.
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
	case t.Bounds.EventStreams < 0, t.Bounds.EventStreamsPerJob < 0, t.Bounds.CallbackConcurrency < 0,
		t.Bounds.StoredBytes < 0, t.Bounds.StoredObjects < 0, t.Bounds.AuditRecordsPerDay < 0, t.Bounds.AuditBytesPerDay < 0:
		return errors.New("bounds must not be negative")
	}
	// Rules built in code rather than parsed must still be rules: the
	// allowance is compared with jobs' rules as the parser writes them.
	for _, r := range t.Egress {
		if back, err := egressrule.ParseRules(r.String()); err != nil || len(back) != 1 || back[0] != r {
			return fmt.Errorf("egress rule %q is not a rule egressrule.ParseRules would return (%v)", r, err)
		}
	}
	return nil
}

func (q Quota) burst() int64 {
	if q.Burst > 0 {
		return q.Burst
	}
	return max(1, int64(math.Ceil(q.SubmissionsPerSecond)))
}

// warnStoredBounds logs when the tenants of the key file may together
// store more than the object store holds: a full store then fails one
// tenant's output because of others' (see Bounds.StoredBytes).
func warnStoredBounds(ctx context.Context, log *slog.Logger, cfg Config) {
	names := map[string]struct{}{}
	for _, n := range cfg.APIKeys {
		names[n] = struct{}{}
	}
	if len(names) == 0 {
		names[job.DefaultTenant] = struct{}{}
	}
	var sum int64
	for n := range names {
		sum += cfg.Tenants[n].Bounds.withDefaults().StoredBytes
	}
	if bucket := cmp.Or(cfg.Blob.MaxBytes, blob.MaxBytesDefault); sum > bucket {
		log.WarnContext(ctx, "the tenants' max_stored_bytes add up to more than the object store holds: once it is full, a tenant under its bound has its job's output refused (output_limit); lower the bounds or raise the store's",
			slog.Int64("sum_bytes", sum), slog.Int64("store_bytes", bucket), slog.Int("tenants", len(names)))
	}
}

// tenantJob returns job id's record if it belongs to tenant, and
// cache.ErrNotFound otherwise: to another tenant a job is indistinguishable
// from one that never existed. Every per-job route looks jobs up here.
func tenantJob(ctx context.Context, st Store, tenant, id string) (cache.Record, error) {
	rec, err := st.GetJob(ctx, id)
	if err != nil {
		return rec, err
	}
	if rec.Message.TenantOrDefault() != tenant {
		return cache.Record{}, fmt.Errorf("get job %s: %w", id, cache.ErrNotFound)
	}
	return rec, nil
}

// tenantMetrics counts submissions and refusals per tenant, under the
// label label gives: metric labels name a bounded set of tenants.
type tenantMetrics struct {
	m     *ktrace.TenantMetrics
	names map[string]struct{} // tenants named in metric labels (metricTenants)
}

// label is the label a tenant is counted under: its name for the
// first MetricsTenants tenants of the key file (by name), "other" beyond.
func (t *tenantMetrics) label(name string) string {
	if _, ok := t.names[name]; ok {
		return name
	}
	return otherTenant
}

// submission counts a submission of tenant's with its outcome.
func (t *tenantMetrics) submission(ctx context.Context, tenant, outcome string) {
	t.m.Submission(ctx, t.label(tenant), outcome)
}

// quotaRefused counts a refusal of tenant's over quota q.
func (t *tenantMetrics) quotaRefused(ctx context.Context, tenant string, q job.Quota) {
	t.m.QuotaRefused(ctx, t.label(tenant), string(q))
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

// tenants applies each tenant's settings of the key file (Config.Tenants)
// to its requests: bounds, cache scope, quotas (quota.go), egress
// (network.go) and callback addresses (callback.go).
type tenants struct {
	cfg      *Config
	store    Store
	queue    *jobQueue // the tenant's backlog, for its queued-jobs quota
	tmetrics *tenantMetrics
}

// tenant returns the settings of the named tenant (zero when not listed).
func (t *tenants) tenant(name string) Tenant { return t.cfg.Tenants[name] }

// tenantBounds returns the named tenant's bounds, defaults applied.
func (t *tenants) tenantBounds(name string) Bounds { return t.cfg.Tenants[name].Bounds.withDefaults() }

// cacheScope is the result-cache scope of a tenant's jobs.
func (t *tenants) cacheScope(name string) string {
	if g := t.tenant(name).CacheGroup; g != "" {
		return "group:" + g
	}
	return "tenant:" + name
}
