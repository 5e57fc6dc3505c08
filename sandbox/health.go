package sandbox

import (
	"context"
	"fmt"
	"time"
)

// healthTimeout bounds one health check: a containerd that takes longer to
// say it serves is as good as down for a job about to start.
const healthTimeout = 2 * time.Second

// Healthy reports whether containerd answers: a cheap health call over the
// client's connection, within healthTimeout. The worker pulls no job while
// it fails, so a backend outage never spends a job's deliveries.
func (r *Containerd) Healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	serving, err := r.client.IsServing(ctx)
	if err != nil {
		return fmt.Errorf("containerd at %s: %w", r.cfg.Address, err)
	}
	if !serving {
		return fmt.Errorf("containerd at %s is not serving", r.cfg.Address)
	}
	return nil
}
