package job

import "time"

// AuditKind is the kind of an audit record (GET /v1/audit?kind=).
type AuditKind string

// The audit record kinds.
const (
	AuditSubmission    AuditKind = "submission"     // a job accepted (queued, coalesced or a cache hit)
	AuditResult        AuditKind = "result"         // a job's result recorded by a worker
	AuditCancel        AuditKind = "cancel"         // a cancel request
	AuditBudgetCreated AuditKind = "budget_created" // POST /v1/budgets
	AuditBudgetRefusal AuditKind = "budget_refusal" // a job its budget could not cover
	AuditReplay        AuditKind = "replay"         // POST /v1/jobs/{id}/replay accepted
	AuditEgress        AuditKind = "egress"         // a connection a job asked its egress proxy for (refusals alike counted in one)
	AuditBoundReached  AuditKind = "audit_bound"    // the tenant's audit log reached its bound for the day (once a day)

	AuditSessionCreated AuditKind = "session_created" // POST /v1/sessions accepted
	AuditSessionCall    AuditKind = "session_call"    // a session call accepted (what it runs, as hashes)
	AuditSessionResult  AuditKind = "session_result"  // a session call's result recorded by its worker
	AuditSessionEnded   AuditKind = "session_ended"   // DELETE /v1/sessions/{id}
	AuditSessionPaused  AuditKind = "session_paused"  // a session paused (POST .../pause)
	AuditSessionResumed AuditKind = "session_resumed" // a paused session resumed (by a call, or POST .../resume)
)

// AuditKinds lists every kind.
func AuditKinds() []AuditKind {
	return []AuditKind{AuditSubmission, AuditResult, AuditCancel, AuditBudgetCreated, AuditBudgetRefusal, AuditReplay, AuditEgress,
		AuditBoundReached, AuditSessionCreated, AuditSessionCall, AuditSessionResult, AuditSessionEnded, AuditSessionPaused, AuditSessionResumed}
}

// AuditSubjectPrefix + tenant token + "." + kind carries a tenant's audit
// records, kept by the AuditStreamName stream.
const (
	AuditSubjectPrefix = "kiln.audit."
	AuditStreamName    = "KILN_AUDIT"
)

// AuditSubject is where tenant's records of kind go; kind "*" matches all.
func AuditSubject(tenant string, kind AuditKind) string {
	return AuditSubjectPrefix + TenantToken(tenant) + "." + string(kind)
}

// AuditRecord is one entry of a tenant's audit log. Code, inputs and outputs
// appear as SHA-256 sums only: the log proves what ran without holding it.
type AuditRecord struct {
	// Seq is the record's position in the audit stream (set when read).
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Kind AuditKind `json:"kind"`
	// Key identifies the API key that made the request: "sha256:" and the
	// first 16 hex digits of its SHA-256 (never the key). Empty for a
	// worker's records and in dev mode.
	Key   string `json:"key,omitempty"`
	JobID string `json:"job_id,omitempty"`
	// SessionID and Call name a session and one of its calls (the session
	// kinds; a budget refusal of a session call).
	SessionID string `json:"session_id,omitempty"`
	Call      int64  `json:"call,omitempty"`
	// Submission: what was asked to run.
	Runtime    string            `json:"runtime,omitempty"`
	Digest     string            `json:"digest,omitempty"`
	CodeSHA256 string            `json:"code_sha256,omitempty"`
	Inputs     map[string]string `json:"inputs,omitempty"` // "stdin", "args", "env", "file:<name>" → SHA-256
	CacheHit   bool              `json:"cache_hit,omitempty"`
	ReplayOf   string            `json:"replay_of,omitempty"`
	Budget     string            `json:"budget,omitempty"`
	// Result: what came out.
	Status   Status            `json:"status,omitempty"`
	ExitCode *int              `json:"exit_code,omitempty"`
	Outputs  map[string]string `json:"outputs,omitempty"` // "stdout", "stderr", "artifact:<name>" → SHA-256
	Detail   string            `json:"detail,omitempty"`
	// Egress: the connection (kind egress).
	Egress *EgressRecord `json:"egress,omitempty"`
	// Count is how many events one record stands for, when more than one:
	// the connections a run was refused for one host, port and reason, or
	// past its connection cap (kind egress; the record is the first of
	// them). A job hammering its proxy adds one record, not one per
	// refusal.
	Count int64 `json:"count,omitempty"`
}
