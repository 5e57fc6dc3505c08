package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// CPUReservation is the answer of ReserveCPU.
type CPUReservation struct {
	// OK says the run may start: its CPU limit is reserved.
	OK bool
	// Used is the CPU time charged to the tenant today (UTC), Reserved what
	// its other runs in flight hold; when !OK they say why.
	Used, Reserved time.Duration
	// RetryAfter is the time until the quota renews (00:00 UTC).
	RetryAfter time.Duration
}

// ReserveCPU reserves cpu (a run's CPU limit) of tenant's CPU-seconds-per-day
// quota limit for job id, as the run starts: granted only when the CPU
// charged today plus what the tenant's other runs in flight reserved leaves
// room for all of it, so runs together never start beyond the quota, in
// whatever batches or on whatever workers they come. A reservation lives
// until SettleCPU, or ttl (a run's worker that died); a second reservation
// for the same job (its retry) replaces the first.
func (s *Quotas) ReserveCPU(ctx context.Context, tenant, id string, cpu, limit, ttl time.Duration, now time.Time) (CPUReservation, error) {
	reply, err := reserveCPUScript.Run(ctx, s.rdb,
		[]string{s.keys.cpuDay(tenant, cpuDay(now)), s.keys.cpuReserved(tenant)},
		id, cpu.Milliseconds(), limit.Milliseconds(), ttl.Milliseconds(), cpuDayTTL.Milliseconds()).Int64Slice()
	if err != nil {
		return CPUReservation{}, fail("reserve cpu time of tenant "+tenant, err)
	}
	if len(reply) != 3 {
		return CPUReservation{}, fmt.Errorf("reserve cpu time of tenant %s: unexpected reply %v", tenant, reply)
	}
	return CPUReservation{OK: reply[0] == 1, Used: time.Duration(reply[1]) * time.Millisecond,
		Reserved: time.Duration(reply[2]) * time.Millisecond, RetryAfter: time.Duration(msUntilUTCMidnight(now)) * time.Millisecond}, nil
}

// SettleCPU ends job id's run: its reservation is dropped and the CPU time
// it used is charged to the tenant's counter of the UTC day of at, in one
// step, so the quota never looks freer than it is between the two.
// Workers call it once per run that recorded a result (cpu 0 when another
// result won).
func (s *Quotas) SettleCPU(ctx context.Context, tenant, id string, cpu time.Duration, at time.Time) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, s.keys.cpuReserved(tenant), id)
		if cpu > 0 {
			key := s.keys.cpuDay(tenant, cpuDay(at))
			p.IncrBy(ctx, key, cpu.Milliseconds())
			p.PExpire(ctx, key, cpuDayTTL)
		}
		return nil
	})
	if err != nil {
		return fail("settle cpu time of tenant "+tenant, err)
	}
	return nil
}

// reserveCPUScript: KEYS[1] the tenant's CPU counter of today, KEYS[2] its
// reservations hash (job id → "ms:expiry ms"); ARGV job id, CPU ms wanted,
// quota ms, reservation TTL ms, hash TTL ms. Expired reservations are
// dropped; the job's own earlier one (a retry) does not count against it.
// Returns {1, used, reserved by others} when reserved, {0, used, reserved}
// when the quota cannot cover it. Time is the server's clock.
var reserveCPUScript = redis.NewScript(serverNowLua + `
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[2])
local held = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ms, exp = string.match(all[i+1], '^(%d+):(%d+)$')
  if not ms or tonumber(exp) <= now then
    redis.call('HDEL', KEYS[2], all[i])
  elseif all[i] ~= ARGV[1] then
    held = held + tonumber(ms)
  end
end
if used + held + want > tonumber(ARGV[3]) then
  return {0, used, held}
end
redis.call('HSET', KEYS[2], ARGV[1], string.format('%d:%.0f', want, now + tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]))
return {1, used, held}
`)
