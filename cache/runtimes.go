package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// RegisterRuntime publishes (or refreshes) a runtime a worker offers, for ttl
// measured on the Redis server's clock. Workers call it periodically, well
// within ttl; an entry not refreshed in time disappears from Runtimes. When
// several workers register the same name, the latest registration wins.
func (s *Fleet) RegisterRuntime(ctx context.Context, info job.RuntimeInfo, ttl time.Duration) error {
	op := "register runtime " + info.Name
	if info.Name == "" {
		return fmt.Errorf("register runtime: name is empty")
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%s: ttl %v is below 1ms", op, ttl)
	}
	raw, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	keys := []string{s.keys.runtimes(), s.keys.runtimeExpiry()}
	if err := registerRuntimeScript.Run(ctx, s.rdb, keys, info.Name, raw, ttl.Milliseconds()).Err(); err != nil {
		return fail(op, err)
	}
	return nil
}

// Runtimes returns every registered runtime whose registration has not
// expired, sorted by name, in one round trip.
func (s *Fleet) Runtimes(ctx context.Context) ([]job.RuntimeInfo, error) {
	const op = "list runtimes"
	keys := []string{s.keys.runtimes(), s.keys.runtimeExpiry()}
	vals, err := runtimesScript.Run(ctx, s.rdb, keys).Slice()
	if err != nil {
		return nil, fail(op, err)
	}
	out := make([]job.RuntimeInfo, 0, len(vals))
	for _, v := range vals {
		raw, ok := v.(string)
		if !ok {
			continue // a name in the expiry index without an entry: nothing to show
		}
		var info job.RuntimeInfo
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			return nil, fmt.Errorf("%s: decode entry: %w", op, err)
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b job.RuntimeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RuntimeRegistered reports whether a registration of the runtime name is in
// the store (expired or not), in one cheap round trip. A worker that
// registered it finds it missing only when the store lost its data (Redis
// restarted empty, a failover to a replica that lagged), and registers again
// at once instead of leaving submissions refused until its next refresh.
func (s *Fleet) RuntimeRegistered(ctx context.Context, name string) (bool, error) {
	_, err := s.rdb.ZScore(ctx, s.keys.runtimeExpiry(), name).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, fail("check runtime registration "+name, err)
	}
	return true, nil
}
