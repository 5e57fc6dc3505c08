package cache

import (
	"context"
	"errors"
	"fmt"

	"github.com/kilnrun/kiln/job"
	"github.com/redis/go-redis/v9"
)

// LookupResult returns the cached result for a job.Key: one GET and one
// decode. ok is false on a miss. An entry that no longer decodes is reported
// as a miss (and logged), so the job runs again and StoreResult overwrites
// it. A small entry is remembered (known.go), so the API's next hit of it
// can be answered in one round trip.
func (s *Results) LookupResult(ctx context.Context, key string) (res job.Result, ok bool, err error) {
	raw, err := s.rdb.Get(ctx, s.keys.result(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		s.known.forget(key, nil)
		return job.Result{}, false, nil
	}
	if err != nil {
		return job.Result{}, false, fail("lookup result "+key, err)
	}
	if res, err = decodeResult(raw); err != nil {
		s.log.WarnContext(ctx, "cache: undecodable result entry treated as a miss", "cache_key", key, "error", err.Error())
		s.known.forget(key, nil)
		return job.Result{}, false, nil
	}
	s.known.note(key, raw) // known.go
	return res, true, nil
}

// StoreResult caches res under a job.Key for Config.ResultTTL, replacing any
// earlier entry. Only deterministic outcomes are stored (res.Cacheable());
// for any other result (timeout, OOM kill, cancellation, internal error) it
// stores nothing and returns nil, so callers may hand it every result.
func (s *Results) StoreResult(ctx context.Context, key string, res job.Result) error {
	if !res.Cacheable() {
		s.log.DebugContext(ctx, "cache: result not cacheable, not stored", "cache_key", key, "status", string(res.Status))
		return nil
	}
	op := "store result " + key
	raw, err := encodeResult(res)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := s.rdb.Set(ctx, s.keys.result(key), raw, s.cfg.ResultTTL).Err(); err != nil {
		return fail(op, err)
	}
	return nil
}
