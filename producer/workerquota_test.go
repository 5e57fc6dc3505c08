package producer

import (
	"context"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// A queued job carries to the worker what the worker enforces of its
// tenant's settings: the CPU quota (none when not set) and the stored
// content bounds (their defaults when not set).
func TestQueuedJobCarriesTenantQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-q": "quoted", "k-free": "free"}
		c.Tenants = map[string]Tenant{"quoted": {Quota: Quota{CPUSecondsPerDay: 3}, Bounds: Bounds{StoredBytes: 5000}}}
	})
	ctx := context.Background()

	for key, want := range map[string]*job.TenantQuota{
		"k-q":    {CPUSecondsPerDay: 3, StoredBytes: 5000, StoredObjects: StoredObjectsDefault},
		"k-free": {StoredBytes: StoredBytesDefault, StoredObjects: StoredObjectsDefault},
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
