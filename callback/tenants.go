package callback

import (
	"sync"
	"time"
)

// TenantConcurrencyDefault is the default of Config.TenantConcurrency.
const TenantConcurrencyDefault = 4

// tenantSlots counts each tenant's callbacks being sent, so a tenant whose
// receiver hangs holds at most its own share of the deliverer: its further
// callbacks are deferred, and other tenants' go out meanwhile.
type tenantSlots struct {
	mu   sync.Mutex
	busy map[string]int
}

// acquire takes one of tenant's limit slots, or reports that all are busy.
func (t *tenantSlots) acquire(tenant string, limit int) (release func(), ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy == nil {
		t.busy = map[string]int{}
	}
	if t.busy[tenant] >= limit {
		return nil, false
	}
	t.busy[tenant]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.busy[tenant]--; t.busy[tenant] <= 0 {
			delete(t.busy, tenant)
		}
	}, true
}

// deferDelay is how long a callback whose tenant has every slot busy waits
// before it is looked at again: a slot frees at the latest when an attempt
// times out.
func (d *Deliverer) deferDelay() time.Duration {
	return max(d.cfg.Timeout/4, 100*time.Millisecond)
}

// tenantLimit is the number of tenant's callbacks sent at once.
func (d *Deliverer) tenantLimit(tenant string) int {
	if d.cfg.TenantConcurrency != nil {
		if n := d.cfg.TenantConcurrency(tenant); n > 0 {
			return n
		}
	}
	return TenantConcurrencyDefault
}
