package worker

import (
	"context"
	"log/slog"
	"time"
)

// registrationChecker is implemented by stores that can tell cheaply
// whether a runtime's registration is still there (cache.Store).
type registrationChecker interface {
	RuntimeRegistered(ctx context.Context, name string) (bool, error)
}

// untilReregister waits until the runtime's registration is due (refresh
// ticks), or until the store is seen to have lost it, checked every
// StoreProbe: Redis restarted empty or failed over to a replica that lagged.
// Without that check the API would refuse every submission for the runtime
// ("no runtime is registered") until the next refresh, up to
// RegistryInterval later. A registration that failed (the store was down)
// is retried every StoreProbe, so a store that comes back empty has the
// registration again within a probe. It reports false once ctx ends, and
// whether the refresh was due (the caller then waits for the next one).
func (r *registrar) untilReregister(ctx context.Context, refresh <-chan time.Time, rt string, registered bool) (again, due bool) {
	rc, ok := r.store.(registrationChecker)
	t := time.NewTicker(r.probe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, false
		case <-refresh:
			return true, true
		case <-t.C:
		}
		if !registered {
			return true, false // retry now
		}
		if !ok {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, r.probe)
		there, err := rc.RuntimeRegistered(cctx, rt)
		cancel()
		if err == nil && !there {
			r.log.WarnContext(ctx, "runtime registration missing from the store (it lost its data); registering again", slog.String("runtime", rt))
			return true, false
		}
	}
}
