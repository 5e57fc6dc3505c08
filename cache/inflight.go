package cache

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// ClaimInflight makes job id the one computing cache key key, unless another
// job already is: SET NX with TTL Config.JobTTL, in one round trip. claimed is
// true when id holds the claim (also when it already did); otherwise leaderID
// is the job that holds it, and the caller can wait for that job's result
// instead of running an identical one. Finish, Cancel and DeleteJob release
// the claim when the leader ends.
func (s *Claims) ClaimInflight(ctx context.Context, key, id string) (leaderID string, claimed bool, err error) {
	prev, err := s.rdb.SetArgs(ctx, s.keys.inflight(key), id, redis.SetArgs{Mode: "NX", Get: true, TTL: s.cfg.JobTTL}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return id, true, nil
	case err != nil:
		return "", false, fail("claim in-flight "+key, err)
	}
	return prev, prev == id, nil
}

// ReleaseInflight deletes the claim on key only if it still names id, so a
// job never releases a claim a later leader has taken.
func (s *Claims) ReleaseInflight(ctx context.Context, key, id string) error {
	if err := releaseInflightScript.Run(ctx, s.rdb, []string{s.keys.inflight(key)}, id).Err(); err != nil {
		return fail("release in-flight "+key, err)
	}
	return nil
}
