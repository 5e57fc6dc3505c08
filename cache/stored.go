package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// StoredUsage is what a tenant's jobs put in the object store during a
// window (the bucket's TTL): what is still stored, give or take objects
// renewed by a later put.
type StoredUsage struct {
	Bytes, Objects int64
}

// storedKeys are tenant's hour counters of the window ending at now,
// newest first.
func (s *Quotas) storedKeys(tenant string, window time.Duration, now time.Time) []string {
	hours := max(int64((window+time.Hour-1)/time.Hour), 1)
	h := now.Unix() / 3600
	keys := make([]string, hours)
	for i := range keys {
		keys[i] = s.keys.storedHour(tenant, h-int64(i))
	}
	return keys
}

// ReserveStored counts an object of size bytes as stored by tenant, unless
// with it what the tenant stored during window would pass maxBytes or
// maxObjects (0: no bound). ok says it was counted; usage is what was
// stored before it. Counts are kept per hour for window, so they lapse as
// the objects do. Release a reservation whose put then failed.
func (s *Quotas) ReserveStored(ctx context.Context, tenant string, size, maxBytes, maxObjects int64, window time.Duration, now time.Time) (usage StoredUsage, ok bool, err error) {
	keys := s.storedKeys(tenant, window, now)
	reply, err := reserveStoredScript.Run(ctx, s.rdb, keys, size, maxBytes, maxObjects, (window + time.Hour).Milliseconds()).Int64Slice()
	if err != nil {
		return usage, false, fail("reserve stored bytes of tenant "+tenant, err)
	}
	if len(reply) != 3 {
		return usage, false, fmt.Errorf("reserve stored bytes of tenant %s: unexpected reply %v", tenant, reply)
	}
	return StoredUsage{Bytes: reply[1], Objects: reply[2]}, reply[0] == 1, nil
}

// ReleaseStored takes back a reservation of ReserveStored made at at.
func (s *Quotas) ReleaseStored(ctx context.Context, tenant string, size int64, at time.Time) error {
	key := s.keys.storedHour(tenant, at.Unix()/3600)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, key, "bytes", -size)
		p.HIncrBy(ctx, key, "objects", -1)
		return nil
	})
	if err != nil {
		return fail("release stored bytes of tenant "+tenant, err)
	}
	return nil
}

// reserveStoredScript: KEYS the tenant's hour counters of the window, the
// current hour first; ARGV size, max bytes (0: none), max objects (0:
// none), the counters' TTL ms. Returns {1, bytes, objects} when counted,
// {0, bytes, objects} when over a bound (the usage before this object).
var reserveStoredScript = redis.NewScript(`
local bytes, objects = 0, 0
for i = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 'bytes', 'objects')
  bytes = bytes + (tonumber(v[1]) or 0)
  objects = objects + (tonumber(v[2]) or 0)
end
local size, maxb, maxo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if (maxb > 0 and bytes + size > maxb) or (maxo > 0 and objects + 1 > maxo) then
  return {0, bytes, objects}
end
redis.call('HINCRBY', KEYS[1], 'bytes', size)
redis.call('HINCRBY', KEYS[1], 'objects', 1)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return {1, bytes, objects}
`)
