package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A worker id names one live worker process at a time. The process holds
// the id by a lease: key worker:<id> = its instance token (unique per
// process start), with a TTL it renews. A second process claiming a live id
// is refused, and the sandboxes labelled with a worker id are only reaped
// by others once that id's lease has lapsed.

// ErrWorkerIDInUse is returned by AcquireWorker when another live process
// holds the worker id.
var ErrWorkerIDInUse = errors.New("worker id in use by a live worker")

// AcquireWorker takes the lease on worker id for instance, for ttl. It
// fails with an error wrapping ErrWorkerIDInUse, naming the holder, while
// another instance's lease is live. Acquiring again with the same instance
// renews.
func (s *Fleet) AcquireWorker(ctx context.Context, id, instance string, ttl time.Duration) error {
	op := "acquire worker id " + id
	holder, err := acquireWorkerScript.Run(ctx, s.rdb, []string{s.keys.worker(id)}, instance, ttl.Milliseconds()).Text()
	if err != nil {
		return fail(op, err)
	}
	if holder != instance {
		return fmt.Errorf("%s: %w (held by %s)", op, ErrWorkerIDInUse, holder)
	}
	return nil
}

// RenewWorker extends instance's lease on worker id to ttl from now. When
// the key is gone (it lapsed, or Redis lost its data) it is taken again;
// held is false only when another instance holds the id now.
func (s *Fleet) RenewWorker(ctx context.Context, id, instance string, ttl time.Duration) (held bool, err error) {
	holder, err := acquireWorkerScript.Run(ctx, s.rdb, []string{s.keys.worker(id)}, instance, ttl.Milliseconds()).Text()
	if err != nil {
		return false, fail("renew worker id "+id, err)
	}
	return holder == instance, nil
}

// ReleaseWorker ends instance's lease on worker id (a clean shutdown), so
// that a restart with the same id need not wait for it to lapse.
func (s *Fleet) ReleaseWorker(ctx context.Context, id, instance string) error {
	if err := releaseWorkerScript.Run(ctx, s.rdb, []string{s.keys.worker(id)}, instance).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fail("release worker id "+id, err)
	}
	return nil
}

// WorkerAlive reports whether some process holds a live lease on worker id.
func (s *Fleet) WorkerAlive(ctx context.Context, id string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.keys.worker(id)).Result()
	if err != nil {
		return false, fail("check worker id "+id, err)
	}
	return n == 1, nil
}

// WorkerInstance is the token of the process holding worker id's lease
// ("" when none does).
func (s *Fleet) WorkerInstance(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.keys.worker(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fail("worker instance "+id, err)
	}
	return v, nil
}

// acquireWorkerScript: KEYS[1] worker key; ARGV instance, TTL ms.
// Takes or renews the lease when free or already ours; returns the holder.
var acquireWorkerScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
`)

// releaseWorkerScript: KEYS[1] worker key; ARGV instance.
var releaseWorkerScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)
