package cache

import "github.com/redis/go-redis/v9"

// The Lua scripts below are every multi-step state change of the package:
// atomic on the server and one round trip (EVALSHA). Field names are those of
// record.go; keys come from keys.go via KEYS or, for the in-flight claim, from
// the record's "inflight" field, which CreateJob filled from keys.go.
//
// A record is live while its status is "queued" or "running"; any other
// status is terminal and no script changes its state again (confirmedLua
// only stamps it). Scripts check that the record exists before writing, so a
// late update never resurrects an expired record as a partial one.
//
// go-redis retries a command after a dropped connection, so every script is
// safe to run twice with the same arguments: the second run reports what the
// first one did.

// releaseInflightLua deletes the job's in-flight claim if it still names the job.
const releaseInflightLua = `
local function release_inflight(job, id)
  local ik = redis.call('HGET', job, 'inflight')
  if ik and redis.call('GET', ik) == id then
    redis.call('DEL', ik)
  end
end
`

// indexLua defines the job index's steps (jobindex.go). index_add(key,
// id, bound, ttl) puts id in the index set key, trims the set of ids older
// than the records' retention (bound: an exclusive lex bound on ids, which
// sort by time) and renews its TTL. index_status(job, id, from, to, bound,
// ttl) moves id from the status set from (nil: none) to the status set to
// (nil: none) of the record's job index (field index), naming them as
// keys.go's jobStatusIndex does; a record made before the index has none,
// and nothing is done.
const indexLua = `
local function index_add(key, id, bound, ttl)
  redis.call('ZADD', key, 0, id)
  redis.call('ZREMRANGEBYLEX', key, '-', bound)
  redis.call('PEXPIRE', key, ttl)
end
local function index_status(job, id, from, to, bound, ttl)
  local base = redis.call('HGET', job, 'index')
  if not base then return end
  if from then redis.call('ZREM', base .. ':s:' .. from, id) end
  if to then index_add(base .. ':s:' .. to, id, bound, ttl) end
end
`

// createJobScript: KEYS[1] job, KEYS[2] the unpublished index, KEYS[3..]
// the job index sets the job enters (its tenant's, its status's, its
// metadata's); ARGV msg JSON, TTL ms, in-flight key or "", "1" to add the
// job to the unpublished index, the creation time (unix ms) and id the
// unpublished index takes, the index trim bound, the job index (the
// record's field index), the index TTL ms. Returns 1 when created (or when
// the record holds this very message: a retried create), 0 when another
// record holds the id.
var createJobScript = redis.NewScript(indexLua + `
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
end
local cur = redis.call('HGET', KEYS[1], 'msg')
if cur then
  if cur == ARGV[1] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'msg', ARGV[1], 'status', 'queued', 'attempt', '0', 'index', ARGV[8])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'inflight', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
for i = 3, #KEYS do
  index_add(KEYS[i], ARGV[6], ARGV[7], ARGV[9])
end
return 1
`)

// deleteJobScript: KEYS[1] job; ARGV id.
// Returns 1 deleted, 0 not queued (left alone), -1 no record. The job
// leaves its tenant's index and its status set; its metadata sets drop it
// when a listing reads it gone (jobindex.go).
var deleteJobScript = redis.NewScript(releaseInflightLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return -1 end
if st ~= 'queued' then return 0 end
release_inflight(KEYS[1], ARGV[1])
local base = redis.call('HGET', KEYS[1], 'index')
if base then
  redis.call('ZREM', base, ARGV[1])
  redis.call('ZREM', base .. ':s:queued', ARGV[1])
end
redis.call('DEL', KEYS[1])
return 1
`)

// leaseLua defines live_lease(job, owner, now): the owner and remaining ms
// of a lease on the record held by someone other than owner and not yet
// lapsed at now, or nil. Lease times are the server's clock, so worker clocks
// do not matter.
const leaseLua = `
local function live_lease(job, owner, now)
  local holder = redis.call('HGET', job, 'lease_owner')
  if not holder or holder == owner then return nil end
  local untilms = tonumber(redis.call('HGET', job, 'lease_until') or '0')
  if untilms <= now then return nil end
  return {holder, untilms - now}
end
`

// markRunningScript: KEYS[1] job; ARGV worker, attempt, started_at, id,
// canceled result (stored form), finished_at, lease owner, lease ms (0: no
// lease), index trim bound, index TTL ms.
// Returns {status after the call}, {'leased', holder, remaining ms} when
// another attempt holds a live lease (nothing changed), or nil when there is
// no record. A running job whose cancellation was requested (the worker
// running it died, and this is its redelivery) becomes canceled instead of
// running again.
var markRunningScript = redis.NewScript(releaseInflightLua + serverNowLua + leaseLua + indexLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return false end
if st ~= 'queued' and st ~= 'running' then return {st} end
if st == 'running' then
  local l = live_lease(KEYS[1], ARGV[7], now)
  if l then return {'leased', l[1], string.format('%.0f', l[2])} end
end
if redis.call('HGET', KEYS[1], 'cancel') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'result', ARGV[5], 'finished_at', ARGV[6])
  release_inflight(KEYS[1], ARGV[4])
  index_status(KEYS[1], ARGV[4], st, 'canceled', ARGV[9], ARGV[10])
  return {'canceled'}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[1], 'attempt', ARGV[2], 'started_at', ARGV[3])
if st == 'queued' then
  index_status(KEYS[1], ARGV[4], 'queued', 'running', ARGV[9], ARGV[10])
end
if tonumber(ARGV[8]) > 0 then
  redis.call('HSET', KEYS[1], 'lease_owner', ARGV[7], 'lease_until', string.format('%.0f', now + tonumber(ARGV[8])))
else
  redis.call('HDEL', KEYS[1], 'lease_owner', 'lease_until')
end
return {'running'}
`)

// renewLeaseScript: KEYS[1] job; ARGV lease owner, lease ms.
// Returns 1 renewed, 0 not held by owner (the job is terminal or another
// attempt took it over), -1 no record.
var renewLeaseScript = redis.NewScript(serverNowLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return -1 end
if st ~= 'running' or redis.call('HGET', KEYS[1], 'lease_owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', string.format('%.0f', now + tonumber(ARGV[2])))
return 1
`)

// confirmedLua defines confirmed(job, flag, now): with flag "1", a write
// that changes nothing of the record's state (its confirmed_at), made so that
// a WAIT after the script has this server's state of the record to wait for
// (replicated.go). It is the one write scripts make to a terminal record.
const confirmedLua = `
local function confirmed(job, flag, now)
  if flag == '1' then
    redis.call('HSET', job, 'confirmed_at', string.format('%.0f', now))
  end
end
`

// finishScript: KEYS[1] job; ARGV status, result (stored form), finished_at, token,
// id, respect leases ("1" or "0"), confirm ("1" or "0": see confirmedLua),
// index trim bound, index TTL ms.
// Returns 1 won, 0 already terminal, -1 no record, 2 refused because a live
// lease is held (only when asked to respect leases). A rerun of the winning
// call (same token) wins again.
var finishScript = redis.NewScript(releaseInflightLua + serverNowLua + leaseLua + confirmedLua + indexLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return -1 end
if st ~= 'queued' and st ~= 'running' then
  confirmed(KEYS[1], ARGV[7], now)
  if redis.call('HGET', KEYS[1], 'finish_token') == ARGV[4] then return 1 end
  return 0
end
if ARGV[6] == '1' and st == 'running' and live_lease(KEYS[1], '', now) then return 2 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'result', ARGV[2], 'finished_at', ARGV[3], 'finish_token', ARGV[4])
release_inflight(KEYS[1], ARGV[5])
index_status(KEYS[1], ARGV[5], st, ARGV[1], ARGV[8], ARGV[9])
return 1
`)

// confirmScript: KEYS[1] job; ARGV confirm ("1" or "0": see confirmedLua,
// applied only to a terminal record).
// Returns the status, or nil when there is no record.
var confirmScript = redis.NewScript(serverNowLua + confirmedLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return false end
if st ~= 'queued' and st ~= 'running' then
  confirmed(KEYS[1], ARGV[1], now)
end
return st
`)

// cancelScript: KEYS[1] job; ARGV canceled result (stored form), finished_at, id,
// index trim bound, index TTL ms.
// Returns {status after the call, "1" if this call made the job canceled},
// or nil when there is no record.
var cancelScript = redis.NewScript(releaseInflightLua + indexLua + `
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return false end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'result', ARGV[1], 'finished_at', ARGV[2], 'cancel', '1')
  release_inflight(KEYS[1], ARGV[3])
  index_status(KEYS[1], ARGV[3], 'queued', 'canceled', ARGV[4], ARGV[5])
  return {'canceled', '1'}
end
if st == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
end
return {st, '0'}
`)

// releaseInflightScript: KEYS[1] in-flight key; ARGV id.
// Deletes the claim only if it still names id; returns 1 if deleted.
var releaseInflightScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// serverNowLua sets now to the server clock in unix milliseconds, so that
// registry expiry does not depend on the clocks of workers and producers.
const serverNowLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// registerRuntimeScript: KEYS[1] runtimes hash, KEYS[2] expiry zset;
// ARGV name, RuntimeInfo JSON, TTL ms. Also drops expired entries.
var registerRuntimeScript = redis.NewScript(serverNowLua + `
local nows = string.format('%.0f', now)
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', nows)
for _, name in ipairs(stale) do
  redis.call('HDEL', KEYS[1], name)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', nows)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%.0f', now + tonumber(ARGV[3])), ARGV[1])
return 1
`)

// runtimesScript: KEYS[1] runtimes hash, KEYS[2] expiry zset.
// Returns the RuntimeInfo JSON of every unexpired runtime.
var runtimesScript = redis.NewScript(serverNowLua + `
local names = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%.0f', now), '+inf')
if #names == 0 then return {} end
return redis.call('HMGET', KEYS[1], unpack(names))
`)
