package job

// Quota names a per-tenant quota set in the API key file.
type Quota string

// The quotas. Over QuotaQueued, QuotaRate or QuotaCPUDay a submission is
// refused with HTTP 429, Retry-After and the problem type QuotaProblemType
// names. QuotaRunning refuses nothing: the tenant's jobs beyond it wait in
// the queue until one of its running jobs ends.
const (
	QuotaQueued  Quota = "max_queued"
	QuotaRunning Quota = "max_running"
	QuotaRate    Quota = "submissions_per_second"
	QuotaCPUDay  Quota = "cpu_seconds_per_day"
	// QuotaEventStreams and QuotaEventStreamsPerJob bound a tenant's open
	// event streams, and one job's: one more is refused with 429.
	QuotaEventStreams       Quota = "max_event_streams"
	QuotaEventStreamsPerJob Quota = "max_event_streams_per_job"
	// QuotaStoredBytes and QuotaStoredObjects bound what a tenant's jobs
	// keep in the object store (artifacts, output too long to keep inline)
	// over its retention: a job whose output would pass them fails with
	// CategoryOutputLimit, naming the bound.
	QuotaStoredBytes   Quota = "max_stored_bytes"
	QuotaStoredObjects Quota = "max_stored_objects"
	// QuotaSessionMemory is a tenant's share of a worker's session memory
	// (the worker's --sessions-tenant-memory-mb): a session that finds
	// every worker asked at the tenant's share is refused with 429, and
	// waits for none of the tenant's sessions to end.
	QuotaSessionMemory Quota = "session_memory"
	// QuotaAuditRecordsPerDay and QuotaAuditBytesPerDay bound what the
	// tenant's actions add to its audit log per UTC day: past them its
	// records are not kept, and one record of kind AuditBoundReached says so.
	QuotaAuditRecordsPerDay Quota = "audit_records_per_day"
	QuotaAuditBytesPerDay   Quota = "audit_bytes_per_day"
)

// ProblemQuotaPrefix + quota name is the RFC 9457 problem type of a
// submission refused by that quota.
const ProblemQuotaPrefix = "urn:kiln:problem:quota-exceeded:"

// QuotaProblemType is the problem type of a submission refused by q.
func QuotaProblemType(q Quota) string { return ProblemQuotaPrefix + string(q) }

// TenantQuota is the part of a tenant's key-file settings a worker applies
// to its jobs; the API puts it on each job's Message as it queues the job.
// Zero fields are no limit.
type TenantQuota struct {
	// CPUSecondsPerDay is the tenant's daily CPU quota: a run reserves its
	// CPU limit of it as it starts, and does not start when what is left
	// (after the CPU charged today and what the tenant's runs in flight
	// reserved) cannot cover it.
	CPUSecondsPerDay int64 `json:"cpu_seconds_per_day,omitempty"`
	// StoredBytes and StoredObjects bound what the tenant's jobs keep in
	// the object store over its retention (QuotaStoredBytes,
	// QuotaStoredObjects).
	StoredBytes   int64 `json:"stored_bytes,omitempty"`
	StoredObjects int64 `json:"stored_objects,omitempty"`
	// DedicatedBoxes: the tenant's jobs run only in boxes that serve no
	// other tenant (key file: dedicated_boxes=true). Otherwise a box serves
	// any tenant, one job at a time, each in a fresh inner sandbox.
	DedicatedBoxes bool `json:"dedicated_boxes,omitempty"`
	// AuditRecordsPerDay and AuditBytesPerDay bound what the tenant adds
	// to its audit log per UTC day (QuotaAuditRecordsPerDay,
	// QuotaAuditBytesPerDay).
	AuditRecordsPerDay int64 `json:"audit_records_per_day,omitempty"`
	AuditBytesPerDay   int64 `json:"audit_bytes_per_day,omitempty"`
}
