package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// AuditAdmission is what ReserveAudit let through of some records a
// tenant is about to append to its audit log.
type AuditAdmission struct {
	// Kept is how many of the records fit the tenant's bounds for the day:
	// the first Kept may be appended, the rest are not.
	Kept int64
	// First is true for the first refusal of the tenant's day: the one
	// caller that appends the record saying the bound was reached.
	First bool
	// Records and Bytes are what the tenant appended that day before.
	Records, Bytes int64
}

// ReserveAudit counts records (of bytes in all, each about bytes/records)
// as appended today (UTC) to tenant's audit log, as many as fit within
// maxRecords and maxBytes for the day (0: no bound). What does not fit is
// counted as refused; the day's first refusal reports First.
func (s *Quotas) ReserveAudit(ctx context.Context, tenant string, records, bytes, maxRecords, maxBytes int64, now time.Time) (AuditAdmission, error) {
	key := s.keys.auditDay(tenant, now.UTC().Format("20060102"))
	reply, err := reserveAuditScript.Run(ctx, s.rdb, []string{key}, records, bytes, maxRecords, maxBytes, (48 * time.Hour).Milliseconds()).Int64Slice()
	if err != nil {
		return AuditAdmission{}, fail("count audit records of tenant "+tenant, err)
	}
	if len(reply) != 4 {
		return AuditAdmission{}, fmt.Errorf("count audit records of tenant %s: unexpected reply %v", tenant, reply)
	}
	return AuditAdmission{Kept: reply[0], First: reply[1] == 1, Records: reply[2], Bytes: reply[3]}, nil
}

// reserveAuditScript: KEYS the tenant's day hash {records, bytes,
// refused}; ARGV records, bytes, max records (0: none), max bytes (0:
// none), the hash's TTL ms. Keeps as many of the records as fit (each
// taken as bytes/records long), counts the rest as refused. Returns {kept,
// 1 when this call made the day's first refusal, records and bytes before}.
var reserveAuditScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'records', 'bytes', 'refused')
local records, bytes, refused = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
local n, size, maxr, maxb = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local each = 0
if n > 0 then each = size / n end
local kept = n
if maxr > 0 then kept = math.min(kept, math.max(maxr - records, 0)) end
if maxb > 0 and each > 0 then kept = math.min(kept, math.max(math.floor((maxb - bytes) / each), 0)) end
local first = 0
if kept < n then
  if refused == 0 then first = 1 end
  redis.call('HINCRBY', KEYS[1], 'refused', n - kept)
end
if kept > 0 then
  redis.call('HINCRBY', KEYS[1], 'records', kept)
  redis.call('HINCRBY', KEYS[1], 'bytes', math.floor(kept * each + 0.5))
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
return {kept, first, records, bytes}
`)
