package cache

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A job is recorded before it is published, so a producer that dies, or whose
// publish times out, between the two leaves a record that no message may
// back. The store keeps the answer in two places: the record's "published"
// field ("1" once JetStream acknowledged the message), and the unpublished
// index (a sorted set of job id → creation time, unix ms) from which a
// reconciler republishes what was never confirmed. A job enters the index
// with its record, in one step (CreateUnpublishedJob).

// MarkPublished records that JetStream acknowledged the job's message: it
// sets the record's published field (if the record exists) and removes the
// job from the unpublished index.
func (s *Jobs) MarkPublished(ctx context.Context, id string) error {
	if err := markPublishedScript.Run(ctx, s.rdb, []string{s.keys.job(id), s.keys.unpublished()}, id).Err(); err != nil && err != redis.Nil {
		return fail("mark job "+id+" published", err)
	}
	return nil
}

// Unpublished returns up to limit ids from the unpublished index created at
// or before olderThan, oldest first.
func (s *Jobs) Unpublished(ctx context.Context, olderThan time.Time, limit int) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, s.keys.unpublished(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(olderThan.UnixMilli(), 10), Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, fail("list unpublished jobs", err)
	}
	return ids, nil
}

// ForgetUnpublished removes the job from the unpublished index without
// marking it published: its record is gone or no longer queued.
func (s *Jobs) ForgetUnpublished(ctx context.Context, id string) error {
	if err := s.rdb.ZRem(ctx, s.keys.unpublished(), id).Err(); err != nil {
		return fail(fmt.Sprintf("forget unpublished job %s", id), err)
	}
	return nil
}

// markPublishedScript: KEYS[1] job, KEYS[2] unpublished index; ARGV id.
var markPublishedScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'published', '1')
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
`)
