package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// RegisterRuntime publishes (or refreshes) a runtime a worker offers, for ttl
// measured on the Redis server's clock. Workers call it periodically, well
// within ttl; an entry not refreshed in time disappears from Runtimes. When
// several workers register the same name, the latest registration wins.
func (s *Store) RegisterRuntime(ctx context.Context, info job.RuntimeInfo, ttl time.Duration) error {
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
func (s *Store) Runtimes(ctx context.Context) ([]job.RuntimeInfo, error) {
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
