package producer

import (
	"context"
	"testing"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/job"
)

// A queued job carries to the worker what the worker enforces of its
// tenant's settings: the CPU quota (none when not set), the stored content
// bounds (their defaults when not set) and whether its boxes are its own;
// its running-jobs bound rides in the message's header.
func TestQueuedJobCarriesTenantQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-q": "quoted", "k-free": "free"}
		c.Tenants = map[string]Tenant{"quoted": {Quota: Quota{CPUSecondsPerDay: 3, MaxRunning: 2}, Bounds: Bounds{StoredBytes: 5000}, DedicatedBoxes: true}}
	})
	ctx := context.Background()

	for key, want := range map[string]*job.TenantQuota{
		"k-q": {CPUSecondsPerDay: 3, StoredBytes: 5000, StoredObjects: StoredObjectsDefault, DedicatedBoxes: true,
			AuditRecordsPerDay: audit.RecordsPerDayDefault, AuditBytesPerDay: audit.BytesPerDayDefault},
		"k-free": {StoredBytes: StoredBytesDefault, StoredObjects: StoredObjectsDefault,
			AuditRecordsPerDay: audit.RecordsPerDayDefault, AuditBytesPerDay: audit.BytesPerDayDefault},
	} {
		accepted(t, b.submit(t, `{"code":"print(1)","cache":false}`, "Authorization", "Bearer "+key))
		m, err := b.worker(t, ctx, succeeded(""))
		if err != nil {
			t.Fatal(err)
		}
		if (m.Quota == nil) != (want == nil) || (want != nil && *m.Quota != *want) {
			t.Errorf("%s: message quota %+v, want %+v", key, m.Quota, want)
		}
	}
}

// A bounded tenant's job carries its max_running in its message's header,
// where the workers read it as they take its jobs; an unbounded tenant's
// carries none.
func TestQueuedJobCarriesItsTenantsRunningBound(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-q": "bounded", "k-free": "free"}
		c.Tenants = map[string]Tenant{"bounded": {Quota: Quota{MaxRunning: 3}}}
	})
	ctx := context.Background()
	s, err := b.js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"k-q": "3", "k-free": ""} {
		accepted(t, b.submit(t, `{"code":"print(1)","cache":false}`, "Authorization", "Bearer "+key))
		m, err := s.GetLastMsgForSubject(ctx, job.TenantJobSubject("python", map[string]string{"k-q": "bounded", "k-free": "free"}[key]))
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(job.HeaderMaxRunning); got != want {
			t.Errorf("%s: %s header %q, want %q", key, job.HeaderMaxRunning, got, want)
		}
	}
}
