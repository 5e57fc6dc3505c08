package cache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// Budget keys, per tenant (job.TenantToken), so another tenant's id names
// nothing:
//
//	<prefix>budget:<token>:<id>      hash  limits, used_*, created/expires ms; TTL its expiry
//	<prefix>budget:<token>:<id>:res  hash  job id → "cpu_ms:wall_ms:deadline ms", a run's reservation
func (k keyspace) budget(tenant, id string) string {
	return k.prefix + "budget:" + job.TenantToken(tenant) + ":" + id
}

func (k keyspace) budgetRes(tenant, id string) string { return k.budget(tenant, id) + ":res" }

// CreateBudget stores a new budget of tenant, expiring at b.ExpiresAt.
func (s *Budgets) CreateBudget(ctx context.Context, tenant string, b job.Budget) error {
	key := s.keys.budget(tenant, b.ID)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "max_runs", b.MaxRuns, "max_cpu_ms", b.MaxCPUMS, "max_wall_ms", b.MaxWallMS,
			"max_artifact_bytes", b.MaxArtifactBytes, "used_runs", 0, "used_cpu_ms", 0, "used_wall_ms", 0,
			"used_artifact_bytes", 0, "created_ms", b.CreatedAt.UnixMilli(), "expires_ms", b.ExpiresAt.UnixMilli())
		p.PExpireAt(ctx, key, b.ExpiresAt)
		return nil
	})
	if err != nil {
		return fail("create budget", err)
	}
	return nil
}

// GetBudget returns tenant's budget id with what is used and reserved;
// ErrNotFound when tenant has no such budget (or it expired).
func (s *Budgets) GetBudget(ctx context.Context, tenant, id string, now time.Time) (job.Budget, error) {
	var h *redis.MapStringStringCmd
	var res *redis.MapStringStringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		h = p.HGetAll(ctx, s.keys.budget(tenant, id))
		res = p.HGetAll(ctx, s.keys.budgetRes(tenant, id))
		return nil
	})
	if err != nil {
		return job.Budget{}, fail("get budget "+id, err)
	}
	f := h.Val()
	if len(f) == 0 {
		return job.Budget{}, fmt.Errorf("get budget %s: %w", id, ErrNotFound)
	}
	n := func(k string) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	b := job.Budget{ID: id,
		BudgetLimits: job.BudgetLimits{MaxRuns: n("max_runs"), MaxCPUMS: n("max_cpu_ms"), MaxWallMS: n("max_wall_ms"), MaxArtifactBytes: n("max_artifact_bytes")},
		Used:         job.BudgetUse{Runs: n("used_runs"), CPUMS: n("used_cpu_ms"), WallMS: n("used_wall_ms"), ArtifactBytes: n("used_artifact_bytes")},
		CreatedAt:    time.UnixMilli(n("created_ms")).UTC(), ExpiresAt: time.UnixMilli(n("expires_ms")).UTC()}
	for _, v := range res.Val() {
		var cpu, wall, deadline int64
		if _, err := fmt.Sscanf(v, "%d:%d:%d", &cpu, &wall, &deadline); err == nil && deadline > now.UnixMilli() {
			b.Reserved.Runs++
			b.Reserved.CPUMS += cpu
			b.Reserved.WallMS += wall
		}
	}
	return b, nil
}

// BudgetReservation is the answer of ReserveBudget.
type BudgetReservation struct {
	// OK says the run is covered: its limits are reserved.
	OK bool
	// Budget is the budget before this reservation (when !OK, why).
	Budget job.Budget
}

// errBudgetReply: the script answered something it never does.
var errBudgetReply = errors.New("unexpected reply")

// reserveBudgetScript reserves one run of a budget for a job, atomically
// against what the budget's ended runs used and what its other jobs hold.
// A job that holds a reservation already keeps it (its deadline renewed):
// the API reserves as it accepts the job, the worker again as the run starts.
//
// KEYS[1] budget hash, KEYS[2] its reservations hash.
// ARGV: job id, cpu ms, wall ms, deadline ms, now ms.
// Returns {ok (1, 0; -1: no budget), used runs, used cpu, used wall, used
// artifact bytes, reserved runs, reserved cpu, reserved wall}.
var reserveBudgetScript = redis.NewScript(`
local b = redis.call('HGETALL', KEYS[1])
if #b == 0 then return {-1,0,0,0,0,0,0,0} end
local f = {}
for i = 1, #b, 2 do f[b[i]] = tonumber(b[i+1]) end
local now = tonumber(ARGV[5])
local rruns, rcpu, rwall = 0, 0, 0
local mine = false
local res = redis.call('HGETALL', KEYS[2])
for i = 1, #res, 2 do
  local cpu, wall, deadline = string.match(res[i+1], '^(%d+):(%d+):(%d+)$')
  if tonumber(deadline) <= now then
    redis.call('HDEL', KEYS[2], res[i])
  elseif res[i] == ARGV[1] then
    mine = true
  else
    rruns = rruns + 1
    rcpu = rcpu + tonumber(cpu)
    rwall = rwall + tonumber(wall)
  end
end
local reply = {0, f.used_runs, f.used_cpu_ms, f.used_wall_ms, f.used_artifact_bytes, rruns, rcpu, rwall}
if mine then
  local cur = redis.call('HGET', KEYS[2], ARGV[1])
  local cpu, wall = string.match(cur, '^(%d+):(%d+):')
  redis.call('HSET', KEYS[2], ARGV[1], cpu .. ':' .. wall .. ':' .. ARGV[4])
  reply[1] = 1
  return reply
end
local cpu, wall = tonumber(ARGV[2]), tonumber(ARGV[3])
if (f.max_runs > 0 and f.used_runs + rruns + 1 > f.max_runs)
  or (f.max_cpu_ms > 0 and f.used_cpu_ms + rcpu + cpu > f.max_cpu_ms)
  or (f.max_wall_ms > 0 and f.used_wall_ms + rwall + wall > f.max_wall_ms)
  or (f.max_artifact_bytes > 0 and f.used_artifact_bytes >= f.max_artifact_bytes) then
  return reply
end
redis.call('HSET', KEYS[2], ARGV[1], cpu .. ':' .. wall .. ':' .. ARGV[4])
redis.call('PEXPIREAT', KEYS[2], f.expires_ms)
reply[1] = 1
return reply
`)

// ReserveBudget reserves one run of tenant's budget id for job jobID, with
// the job's CPU and wall-clock limits, until deadline (a reservation whose
// job never ends lapses then). Artifact bytes cannot be known before a run:
// a budget whose artifact bytes are used up covers no further run.
// ErrNotFound when tenant has no such budget.
func (s *Budgets) ReserveBudget(ctx context.Context, tenant, id, jobID string, l job.Limits, deadline, now time.Time) (BudgetReservation, error) {
	reply, err := reserveBudgetScript.Run(ctx, s.rdb, []string{s.keys.budget(tenant, id), s.keys.budgetRes(tenant, id)},
		jobID, l.CPUMS, l.TimeoutMS, deadline.UnixMilli(), now.UnixMilli()).Int64Slice()
	if err != nil {
		return BudgetReservation{}, fail("reserve budget "+id, err)
	}
	if len(reply) != 8 {
		return BudgetReservation{}, fmt.Errorf("reserve budget %s: %w %v", id, errBudgetReply, reply)
	}
	if reply[0] == -1 {
		return BudgetReservation{}, fmt.Errorf("reserve budget %s: %w", id, ErrNotFound)
	}
	b, err := s.GetBudget(ctx, tenant, id, now)
	if err != nil {
		return BudgetReservation{}, err
	}
	b.Used = job.BudgetUse{Runs: reply[1], CPUMS: reply[2], WallMS: reply[3], ArtifactBytes: reply[4]}
	b.Reserved = job.BudgetUse{Runs: reply[5], CPUMS: reply[6], WallMS: reply[7]}
	return BudgetReservation{OK: reply[0] == 1, Budget: b}, nil
}

// settleBudgetScript ends a job's reservation and charges what its run
// used, once: a job without a reservation (settled already, or never
// reserved) charges nothing.
//
// KEYS[1] budget hash, KEYS[2] its reservations hash.
// ARGV: job id, ran (1: charge a run), cpu ms, wall ms, artifact bytes.
// Returns 1 when charged, 0 when there was nothing to settle.
var settleBudgetScript = redis.NewScript(`
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], 'used_runs', 1) end
redis.call('HINCRBY', KEYS[1], 'used_cpu_ms', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'used_wall_ms', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'used_artifact_bytes', ARGV[5])
return 1
`)

// SettleBudget ends job jobID's reservation of tenant's budget id and
// charges use (a run when ran) in one step. Settling twice charges once.
func (s *Budgets) SettleBudget(ctx context.Context, tenant, id, jobID string, ran bool, use job.BudgetUse) (bool, error) {
	r := "0"
	if ran {
		r = "1"
	}
	n, err := settleBudgetScript.Run(ctx, s.rdb, []string{s.keys.budget(tenant, id), s.keys.budgetRes(tenant, id)},
		jobID, r, use.CPUMS, use.WallMS, use.ArtifactBytes).Int64()
	if err != nil {
		return false, fail("settle budget "+id, err)
	}
	return n == 1, nil
}
