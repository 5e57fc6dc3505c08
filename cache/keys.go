package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/kilnrun/kiln/job"
)

// keyspace builds every Redis key Kiln uses, so the key space reads at a glance:
//
//	<prefix>job:<id>                 hash    job record (fields: see record.go), TTL JobTTL
//	<prefix>result:<key>             string  cached job.Result (stored form, resultcodec.go) by job.Key, TTL ResultTTL
//	<prefix>hitresult:<sha256>       string  a result-cache entry's stored form, named by its SHA-256, as the records of its cache hits name it (hittx.go), TTL at least JobTTL past the newest such record
//	<prefix>inflight:<key>           string  id of the job currently computing job.Key, TTL JobTTL
//	<prefix>idem:<scope>:<sha256>    string  Idempotency-Key claim {job_id, body_hash}, TTL JobTTL
//	<prefix>runtimes                 hash    runtime name → job.RuntimeInfo JSON
//	<prefix>runtimes:expiry          zset    runtime name → expiry (server clock, unix ms)
//	<prefix>unpublished              zset    job id → created_at (unix ms) of jobs not yet confirmed published
//	<prefix>worker:<id>              string  the live worker process holding id (WorkerLease), TTL its lease
//	<prefix>session:<id>[:...]       hash    sessions' catalog and calls (sessions.go, which builds them)
//	<prefix>jobs:<token>             zset    a tenant's jobs: ids, all of score 0 (jobindex.go), TTL JobTTL from the latest added
//	<prefix>jobs:<token>:s:<status>  zset    the same, of one status
//	<prefix>jobs:<token>:t:<sha256>  zset    the same, of one metadata pair (key, value), named by its hash
//
// A job record also stores the name of its in-flight key (field "inflight"),
// so the scripts that end a job can release the claim without another round
// trip. That key is always built here, never in Lua. Likewise the record
// stores its tenant's job index (field "index"), and the scripts that change
// a job's status move it between that index's status sets, whose names
// they make as jobStatusIndex does: the index, ":s:", the status.
type keyspace struct{ prefix string }

func (k keyspace) job(id string) string        { return k.prefix + "job:" + id }
func (k keyspace) result(key string) string    { return k.prefix + "result:" + key }
func (k keyspace) inflight(key string) string  { return k.prefix + "inflight:" + key }
func (k keyspace) hitResult(sum string) string { return k.prefix + "hitresult:" + sum }

// idempotency hashes the client-chosen key: it keeps client text out of the
// key space, bounds the key's length, and, being fixed-length at the end,
// makes the scope/key split unambiguous whatever the scope contains.
func (k keyspace) idempotency(scope, key string) string {
	sum := sha256.Sum256([]byte(key))
	return k.prefix + "idem:" + scope + ":" + hex.EncodeToString(sum[:])
}

func (k keyspace) runtimes() string      { return k.prefix + "runtimes" }
func (k keyspace) runtimeExpiry() string { return k.prefix + "runtimes:expiry" }

// Tenant quota keys (quota.go), named by job.TenantToken so any tenant name
// makes a well-formed key:
//
//	<prefix>quota:rate:<token>          hash    token bucket {tokens, ts (server ms)}, TTL time to refill
//	<prefix>quota:cpu:<token>:<yyyymmdd> string CPU ms charged that UTC day, TTL 48h
//	<prefix>quota:audit:<token>:<yyyymmdd> hash audit records appended that UTC day {records, bytes, refused}, TTL 48h
func (k keyspace) rateBucket(tenant string) string {
	return k.prefix + "quota:rate:" + job.TenantToken(tenant)
}

func (k keyspace) cpuDay(tenant, day string) string {
	return k.prefix + "quota:cpu:" + job.TenantToken(tenant) + ":" + day
}

// storedHour is the hash counting what a tenant's jobs put in the object
// store during one hour (unix hours): fields bytes, objects (stored.go).
func (k keyspace) storedHour(tenant string, hour int64) string {
	return k.prefix + "quota:stored:" + job.TenantToken(tenant) + ":" + strconv.FormatInt(hour, 10)
}

// auditDay is the hash counting what a tenant appended to its audit log
// on one UTC day (yyyymmdd): fields records, bytes, refused (auditbound.go).
func (k keyspace) auditDay(tenant, day string) string {
	return k.prefix + "quota:audit:" + job.TenantToken(tenant) + ":" + day
}

// cpuReserved is the hash of a tenant's CPU reservations: job id →
// "ms:expiry ms" (cpu_reserve.go).
func (k keyspace) cpuReserved(tenant string) string {
	return k.prefix + "quota:cpures:" + job.TenantToken(tenant)
}

func (k keyspace) unpublished() string { return k.prefix + "unpublished" }

// jobIndex is tenant's job index: every job of the tenant still recorded.
func (k keyspace) jobIndex(tenant string) string {
	return k.prefix + "jobs:" + job.TenantToken(tenant)
}

// jobStatusIndex is the part of a job index (jobIndex) of one status.
// statusIndexLua makes the same name in the scripts.
func jobStatusIndex(index string, st job.Status) string { return index + ":s:" + string(st) }

// jobTagIndex is the part of a job index (jobIndex) whose metadata holds
// key=value. The pair is hashed: it is the caller's text, of any length.
func jobTagIndex(index, key, value string) string {
	sum := sha256.Sum256([]byte(key + "\x00" + value))
	return index + ":t:" + hex.EncodeToString(sum[:16])
}
func (k keyspace) worker(id string) string {
	return k.prefix + "worker:" + id
}
