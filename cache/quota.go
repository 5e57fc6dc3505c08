package cache

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// Admission is the answer of AdmitSubmission: Quota is "" when the
// submission may go ahead, else the quota it is over and how long until it
// would be admitted.
type Admission struct {
	Quota      job.Quota
	RetryAfter time.Duration
}

// Rate is a token bucket: PerSecond tokens added per second, at most Burst
// held. A zero PerSecond is no limit.
type Rate struct {
	PerSecond float64
	Burst     int64
}

// cpuDayTTL keeps a day's CPU counter until the day is surely over everywhere.
const cpuDayTTL = 48 * time.Hour

// cpuDay is the UTC day a CPU charge at t counts in.
func cpuDay(t time.Time) string { return t.UTC().Format("20060102") }

// AdmitSubmission decides, in one round trip, whether tenant may submit a
// job now: refused while its CPU time charged today (UTC) has reached
// cpuLimit (0: no limit), else a token is taken from its bucket (rate.PerSecond
// 0: no limit). A refusal takes no token.
func (s *Quotas) AdmitSubmission(ctx context.Context, tenant string, rate Rate, cpuLimit time.Duration, now time.Time) (Admission, error) {
	if rate.PerSecond <= 0 && cpuLimit <= 0 {
		return Admission{}, nil
	}
	reply, err := admitScript.Run(ctx, s.rdb,
		[]string{s.keys.rateBucket(tenant), s.keys.cpuDay(tenant, cpuDay(now))},
		strconv.FormatFloat(rate.PerSecond, 'f', -1, 64), max(rate.Burst, 1), cpuLimit.Milliseconds(),
		msUntilUTCMidnight(now)).Int64Slice()
	if err != nil {
		return Admission{}, fail("admit submission of tenant "+tenant, err)
	}
	if len(reply) != 2 {
		return Admission{}, fmt.Errorf("admit submission of tenant %s: unexpected reply %v", tenant, reply)
	}
	wait := time.Duration(reply[1]) * time.Millisecond
	switch reply[0] {
	case 1:
		return Admission{Quota: job.QuotaCPUDay, RetryAfter: wait}, nil
	case 2:
		return Admission{Quota: job.QuotaRate, RetryAfter: wait}, nil
	}
	return Admission{}, nil
}

// CPUUsed returns the CPU time charged to tenant on the UTC day of at.
func (s *Quotas) CPUUsed(ctx context.Context, tenant string, at time.Time) (time.Duration, error) {
	n, err := s.rdb.Get(ctx, s.keys.cpuDay(tenant, cpuDay(at))).Int64()
	if err != nil && err != redis.Nil {
		return 0, fail("read cpu time of tenant "+tenant, err)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func msUntilUTCMidnight(now time.Time) int64 {
	now = now.UTC()
	next := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	return max(next.Sub(now).Milliseconds(), 1)
}

// admitScript: KEYS[1] rate bucket hash, KEYS[2] CPU day counter; ARGV rate
// per second ("0": none), burst, CPU limit ms (0: none), ms until the CPU
// day ends. Returns {0, 0} admitted (a token taken), {1, retry ms} over the
// CPU quota, {2, retry ms} over the rate. The bucket's time is the server's
// clock, so producers' clocks do not matter.
var admitScript = redis.NewScript(serverNowLua + `
local cpulimit = tonumber(ARGV[3])
if cpulimit > 0 then
  local used = tonumber(redis.call('GET', KEYS[2]) or '0')
  if used >= cpulimit then return {1, tonumber(ARGV[4])} end
end
local rate = tonumber(ARGV[1])
if rate <= 0 then return {0, 0} end
local burst = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local ttl = math.ceil(burst / rate * 1000) + 1000
if tokens < 1 then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {2, math.ceil((1 - tokens) / rate * 1000)}
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ttl)
return {0, 0}
`)
