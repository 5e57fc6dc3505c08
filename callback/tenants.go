package callback

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kilnrun/kiln/internal/queue"
)

// Defaults of Config.TenantConcurrency and Config.DestinationConcurrency.
const (
	TenantConcurrencyDefault = 4
	// DestinationConcurrencyDefault is below TenantConcurrencyDefault: a
	// tenant whose one receiver hangs still has slots for its others.
	DestinationConcurrencyDefault = 2
)

// slots counts the callbacks being sent per key (a tenant, or a
// destination), so a tenant or a receiver that hangs holds at most its own
// share of the deliverer: further callbacks of that key are deferred, and
// the others' go out meanwhile. Each busy slot keeps the time its attempt
// ends at the latest (its start plus the attempt timeout).
type slots struct {
	mu   sync.Mutex
	busy map[string][]time.Time
}

// acquire takes one of key's limit slots for an attempt that ends by
// deadline, or reports that all are busy and when the first of them is
// free at the latest.
func (t *slots) acquire(key string, limit int, deadline time.Time) (release func(), free time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy == nil {
		t.busy = map[string][]time.Time{}
	}
	if b := t.busy[key]; len(b) >= limit {
		return nil, slices.MinFunc(b, time.Time.Compare), false
	}
	t.busy[key] = append(t.busy[key], deadline)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		b := t.busy[key]
		if i := slices.IndexFunc(b, deadline.Equal); i >= 0 {
			b = slices.Delete(b, i, i+1)
		}
		if len(b) == 0 {
			delete(t.busy, key)
		} else {
			t.busy[key] = b
		}
	}, time.Time{}, true
}

// busyOf is the number of key's slots taken.
func (t *slots) busyOf(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.busy[key])
}

// waiters are, for each destination, the tenants that parked a callback
// because its slots were busy, in the order they did: as a slot frees,
// the first of them has one of its parked callbacks moved back.
type waiters struct {
	mu sync.Mutex
	q  map[string][]string
}

// add queues token for dest, once.
func (w *waiters) add(dest, token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.q == nil {
		w.q = map[string][]string{}
	}
	if !slices.Contains(w.q[dest], token) {
		w.q[dest] = append(w.q[dest], token)
	}
}

// next takes the first tenant waiting for dest.
func (w *waiters) next(dest string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q[dest]
	if len(q) == 0 {
		return "", false
	}
	if len(q) == 1 {
		delete(w.q, dest)
	} else {
		w.q[dest] = q[1:]
	}
	return q[0], true
}

// destination is the receiver a callback URL reaches: its scheme, host and
// port, lower-cased (paths on one receiver share it).
func destination(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return strings.ToLower(raw)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.ToLower(u.Scheme + "://" + u.Hostname() + ":" + port)
}

// destinationKey names destination dest in a subject token: the first
// 16 hex digits of its SHA-256.
func destinationKey(dest string) string {
	sum := sha256.Sum256([]byte(dest))
	return hex.EncodeToString(sum[:8])
}

// deferDelay is how long a callback whose tenant or destination has every
// slot busy waits before it is looked at again: 100 ms after its first
// delivery, doubling with each (a callback to a receiver that is only busy
// goes out soon; one waiting on a receiver that hangs is looked at less
// and less often, so it does not crowd its tenant's other callbacks out of
// their consumer), never past the time the first busy slot is free at the
// latest (free).
func (d *Deliverer) deferDelay(deliveries uint64, free time.Time) time.Duration {
	delay := deferDelayMin << min(max(deliveries, 1)-1, 16)
	return max(min(delay, free.Sub(d.cfg.Now())), deferDelayMin)
}

// deferDelayMin is the shortest wait of a deferred callback.
const deferDelayMin = 100 * time.Millisecond

// destinationLimit is the number of callbacks sent at once to one
// destination, whatever their tenants.
func (d *Deliverer) destinationLimit() int {
	return cmp.Or(d.cfg.DestinationConcurrency, DestinationConcurrencyDefault)
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

// parkedSet holds, for each tenant, the keys of the destinations whose
// callbacks of its a deliverer parked, and the one it last moved a
// callback back to, so that its destinations take turns.
type parkedSet struct {
	mu    sync.Mutex
	dests map[string]map[string]bool // tenant token → destination keys
	last  map[string]string          // tenant token → destination key
}

func (s *parkedSet) add(p queue.Parked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dests == nil {
		s.dests, s.last = map[string]map[string]bool{}, map[string]string{}
	}
	if s.dests[p.Token] == nil {
		s.dests[p.Token] = map[string]bool{}
	}
	s.dests[p.Token][p.Dest] = true
}

func (s *parkedSet) has(p queue.Parked) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dests[p.Token][p.Dest]
}

func (s *parkedSet) remove(p queue.Parked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.dests[p.Token], p.Dest)
	if len(s.dests[p.Token]) == 0 {
		delete(s.dests, p.Token)
		delete(s.last, p.Token)
	}
}

// turn lists token's destinations that ok accepts, starting after the one
// the previous turn started with, and records the first as taking its
// turn.
func (s *parkedSet) turn(token string, ok func(dest string) bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var dests []string
	for dest := range s.dests[token] {
		if ok(dest) {
			dests = append(dests, dest)
		}
	}
	if len(dests) == 0 {
		return nil
	}
	slices.Sort(dests)
	i, _ := slices.BinarySearch(dests, s.last[token]+"\x00")
	dests = slices.Concat(dests[i:], dests[:i])
	s.last[token] = dests[0]
	return dests
}

// seenNames maps a subject token (a tenant's token, a destination's key)
// back to what it names, for as long as the deliverer may need it: from
// the callback that showed it until two sweeps running find nothing of it
// parked or being sent. So a deliverer that has seen a million tenants
// holds the names of those with callbacks waiting, not all of them.
type seenNames struct {
	mu    sync.Mutex
	names map[string]string
	idle  map[string]bool // nothing of it at the last sweep
}

func (n *seenNames) store(k, v string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names == nil {
		n.names, n.idle = map[string]string{}, map[string]bool{}
	}
	n.names[k] = v
	delete(n.idle, k)
}

func (n *seenNames) load(k string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.names[k]
	return v, ok
}

func (n *seenNames) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.names)
}

// sweep forgets each name that keep rejects now and did at the last sweep
// (a name stored since counts as kept).
func (n *seenNames) sweep(keep func(k, v string) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, v := range n.names {
		switch {
		case keep(k, v):
			delete(n.idle, k)
		case n.idle[k]:
			delete(n.names, k)
			delete(n.idle, k)
		default:
			n.idle[k] = true
		}
	}
}
