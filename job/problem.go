package job

// ProblemType is the "type" member of an RFC 9457 problem document the API
// answers with. They are URNs, stable wherever the API is deployed; clients
// branch on them (the Go client's errors.Is sentinels, the SDKs' exception
// classes), never on the text.
type ProblemType string

// The API's problem types.
const (
	ProblemMalformedJSON        ProblemType = "urn:kiln:problem:malformed-json"
	ProblemUnknownField         ProblemType = "urn:kiln:problem:unknown-field"
	ProblemUnsupportedMediaType ProblemType = "urn:kiln:problem:unsupported-media-type"
	ProblemBodyTooLarge         ProblemType = "urn:kiln:problem:body-too-large"
	ProblemInvalidField         ProblemType = "urn:kiln:problem:invalid-field"
	ProblemBatchTooLarge        ProblemType = "urn:kiln:problem:batch-too-large"
	ProblemInvalidParameter     ProblemType = "urn:kiln:problem:invalid-parameter"
	ProblemInvalidID            ProblemType = "urn:kiln:problem:invalid-id"
	ProblemNotFound             ProblemType = "urn:kiln:problem:not-found"
	ProblemMethodNotAllowed     ProblemType = "urn:kiln:problem:method-not-allowed"
	ProblemIdempotencyKeyReused ProblemType = "urn:kiln:problem:idempotency-key-reused"
	ProblemUnauthorized         ProblemType = "urn:kiln:problem:unauthorized"
	ProblemQueueFull            ProblemType = "urn:kiln:problem:queue-full"
	ProblemUnavailable          ProblemType = "urn:kiln:problem:unavailable"
	ProblemInternal             ProblemType = "urn:kiln:problem:internal"
	ProblemDuplicateField       ProblemType = "urn:kiln:problem:duplicate-field"
	ProblemFieldNameCase        ProblemType = "urn:kiln:problem:field-name-case"
	ProblemBusy                 ProblemType = "urn:kiln:problem:busy"
	ProblemResponseTooLarge     ProblemType = "urn:kiln:problem:response-too-large"
	// ProblemBudgetExhausted: the budget the job names cannot cover its
	// limits; not retryable (a new budget, or lower limits, is needed).
	ProblemBudgetExhausted ProblemType = "urn:kiln:problem:budget-exhausted"
	// ProblemReplayUnavailable: a job cannot be replayed as it ran (its
	// image digest is no longer served, its inputs are gone, or it has not
	// finished); the detail says which.
	ProblemReplayUnavailable ProblemType = "urn:kiln:problem:replay-unavailable"
	ProblemSessionEnded      ProblemType = "urn:kiln:problem:session-ended"
	// ProblemEgressNotAllowed: the job's network allowlist names a host
	// its API key does not allow (or the key allows no network at all);
	// the detail names the host and the key's allowance. Not retryable.
	ProblemEgressNotAllowed ProblemType = "urn:kiln:problem:egress-not-allowed"
	// ProblemFileConflict: a file operation on a session's /work that its
	// files make impossible (something already there, a file where a
	// directory is needed, a directory not empty, a symbolic link in the
	// way); the detail says which. Not retryable as it is.
	ProblemFileConflict ProblemType = "urn:kiln:problem:file-conflict"
	// ProblemStdinClosed: a write to a session command's stdin found it
	// closed (the command was started without stdin, its stdin was
	// closed, or the command no longer reads it). Not retryable.
	ProblemStdinClosed ProblemType = "urn:kiln:problem:stdin-closed"
)

// ProblemTypes lists the API's problem types (the quota-exceeded family,
// ProblemQuotaPrefix + a quota's name, aside).
func ProblemTypes() []ProblemType {
	return []ProblemType{
		ProblemMalformedJSON, ProblemUnknownField, ProblemUnsupportedMediaType, ProblemBodyTooLarge,
		ProblemInvalidField, ProblemBatchTooLarge, ProblemInvalidParameter, ProblemInvalidID,
		ProblemNotFound, ProblemMethodNotAllowed, ProblemIdempotencyKeyReused, ProblemUnauthorized,
		ProblemQueueFull, ProblemUnavailable, ProblemInternal, ProblemDuplicateField,
		ProblemFieldNameCase, ProblemBusy, ProblemResponseTooLarge, ProblemBudgetExhausted,
		ProblemReplayUnavailable, ProblemSessionEnded, ProblemEgressNotAllowed, ProblemFileConflict,
		ProblemStdinClosed,
	}
}
