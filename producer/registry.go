package producer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/job"
)

// registry caches the runtime list workers publish in Redis for
// Config.RuntimeCacheTTL, so the submit path reads it from memory.
type registry struct {
	store     Store
	ttl       time.Duration
	policy    job.Policy
	lossGrace time.Duration // registryLossGrace; shorter in tests
	now       func() time.Time

	mu   sync.Mutex // serialises refreshes; readers never take it
	snap atomic.Pointer[registrySnapshot]
}

type registrySnapshot struct {
	at     time.Time
	filled time.Time         // when the registry was last read with entries in it
	list   []job.RuntimeInfo // Limits replaced by the effective policy
	byName map[string]job.RuntimeInfo
	names  []string
}

// registryLossGrace is how long a registry read empty right after it was
// read with entries keeps answering with those entries: long enough for
// workers to notice that the store lost their registrations (every
// worker.Config.StoreProbe, 500ms by default) and register again.
const registryLossGrace = 5 * time.Second

func newRegistry(store Store, ttl time.Duration, policy job.Policy, now func() time.Time) *registry {
	return &registry{store: store, ttl: ttl, policy: policy, lossGrace: registryLossGrace, now: now}
}

// current returns a snapshot no older than the TTL, reading Redis if needed.
func (r *registry) current(ctx context.Context) (*registrySnapshot, error) {
	if s := r.snap.Load(); s != nil && r.now().Sub(s.at) < r.ttl {
		return s, nil
	}
	return r.refresh(ctx, r.ttl)
}

// refresh reads the registry unless another caller did within maxAge.
func (r *registry) refresh(ctx context.Context, maxAge time.Duration) (*registrySnapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.snap.Load(); s != nil && r.now().Sub(s.at) < maxAge {
		return s, nil
	}
	infos, err := r.store.Runtimes(ctx)
	if err != nil {
		return nil, fmt.Errorf("read runtime registry: %w", err)
	}
	now := r.now()
	if prev := r.snap.Load(); len(infos) == 0 && prev != nil && len(prev.list) > 0 && now.Sub(prev.filled) < r.lossGrace {
		// Entries expire one by one; a registry that emptied all at once
		// is the store having lost its data, and the workers register
		// again within a store probe. Until they do, keep accepting their
		// runtimes (the jobs queue) rather than refuse every submission.
		kept := *prev
		kept.at = now
		r.snap.Store(&kept)
		return &kept, nil
	}
	s := &registrySnapshot{at: now, filled: now, byName: make(map[string]job.RuntimeInfo, len(infos))}
	for _, info := range infos {
		info.Limits = withRuntimeDefaults(effectivePolicy(r.policy, info.Limits), info.DefaultLimits)
		s.list = append(s.list, info)
		s.byName[info.Name] = info
		s.names = append(s.names, info.Name)
	}
	r.snap.Store(s)
	return s, nil
}

// lookup returns the runtime called name, or a *job.InvalidError listing the
// known ones. A name missing from a snapshot older than a tenth of the TTL
// triggers one early re-read, so a runtime registered a moment ago is found.
func (r *registry) lookup(ctx context.Context, name string) (job.RuntimeInfo, error) {
	s, err := r.current(ctx)
	if err != nil {
		return job.RuntimeInfo{}, err
	}
	if info, ok := s.byName[name]; ok {
		return info, nil
	}
	if r.now().Sub(s.at) > r.ttl/10 {
		if s, err = r.refresh(ctx, r.ttl/10); err != nil {
			return job.RuntimeInfo{}, err
		}
		if info, ok := s.byName[name]; ok {
			return info, nil
		}
	}
	if len(s.names) == 0 {
		// Not the request's fault: no worker has registered (none runs, or
		// the store lost the registrations and the workers are registering
		// again, within a store probe). The client retries.
		return job.RuntimeInfo{}, fmt.Errorf("runtime %q: %w", name, errNoRuntimes)
	}
	return job.RuntimeInfo{}, job.ValidateRuntime(name, s.names) // an *InvalidError listing them
}

// effectivePolicy is the stricter of the server's policy and the one a
// runtime registered: the smaller maximum per field, and the server default
// lowered to that maximum. A maximum the runtime left at zero (or a runtime
// that registered no policy) leaves the server's in place.
func effectivePolicy(server, runtime job.Policy) job.Policy {
	out := server
	pairs := []struct {
		def, max *int64
		rmax     int64
	}{
		{&out.Default.TimeoutMS, &out.Max.TimeoutMS, runtime.Max.TimeoutMS},
		{&out.Default.MemoryMB, &out.Max.MemoryMB, runtime.Max.MemoryMB},
		{&out.Default.CPUMS, &out.Max.CPUMS, runtime.Max.CPUMS},
		{&out.Default.Pids, &out.Max.Pids, runtime.Max.Pids},
		{&out.Default.OutputBytes, &out.Max.OutputBytes, runtime.Max.OutputBytes},
		{&out.Default.DiskMB, &out.Max.DiskMB, runtime.Max.DiskMB},
	}
	for _, p := range pairs {
		if p.rmax > 0 {
			*p.max = min(*p.max, p.rmax)
		}
		*p.def = min(*p.def, *p.max)
	}
	// The larger minimum: a runtime that cannot start below it says so.
	out.Min.MemoryMB = max(out.Min.MemoryMB, runtime.Min.MemoryMB)
	out.Default.MemoryMB = max(out.Default.MemoryMB, out.Min.MemoryMB)
	return out
}

// withRuntimeDefaults sets the defaults a runtime's profile asks for (its
// non-zero fields) in p, each lowered to p's maximum.
func withRuntimeDefaults(p job.Policy, def job.Limits) job.Policy {
	pairs := []struct {
		def  *int64
		max  int64
		want int64
	}{
		{&p.Default.TimeoutMS, p.Max.TimeoutMS, def.TimeoutMS},
		{&p.Default.MemoryMB, p.Max.MemoryMB, def.MemoryMB},
		{&p.Default.CPUMS, p.Max.CPUMS, def.CPUMS},
		{&p.Default.Pids, p.Max.Pids, def.Pids},
		{&p.Default.OutputBytes, p.Max.OutputBytes, def.OutputBytes},
		{&p.Default.DiskMB, p.Max.DiskMB, def.DiskMB},
	}
	for _, f := range pairs {
		if f.want > 0 {
			*f.def = min(f.want, f.max)
		}
	}
	return p
}

// hostsSessions refuses info's runtime for a session unless its workers
// said they host sessions (a worker of an earlier version says nothing:
// its runtime is taken at its word); the refusal names the runtimes that
// do.
func (r *registry) hostsSessions(ctx context.Context, info job.RuntimeInfo) error {
	if info.Sessions == nil || *info.Sessions {
		return nil
	}
	s, err := r.current(ctx)
	if err != nil {
		return err
	}
	var with []string
	for _, other := range s.list {
		if other.Sessions == nil || *other.Sessions {
			with = append(with, other.Name)
		}
	}
	msg := fmt.Sprintf("runtime %q has no sessions (its sandboxes do not keep an interpreter between calls); run its code as jobs", info.Name)
	if len(with) > 0 {
		msg += ", or open a session of a runtime that has them: " + strings.Join(with, ", ")
	}
	return &job.InvalidError{Field: "runtime", Message: msg}
}
