package job

import (
	"crypto/rand"
	"fmt"
	"regexp"

	"github.com/google/uuid"
)

// NATS names shared by producers and workers.
const (
	// StreamName is the JetStream work-queue stream holding queued jobs:
	// each tenant's backlog, on a subject of its own (TenantJobSubject).
	StreamName = "KILN_JOBS"
	// SubjectPrefix + runtime is where a job is published ("kiln.jobs.python").
	SubjectPrefix = "kiln.jobs."
	// ReadyStreamName is the stream of jobs a worker has taken off their
	// tenant's backlog, in fair turns, for a free slot: the hand-off the
	// workers' shared consumers deliver from (internal/queue).
	ReadyStreamName = "KILN_READY"
	// ReadySubjectPrefix starts every subject of ReadyStreamName.
	ReadySubjectPrefix = "kiln.ready."
	// DoneSubjectPrefix + job id carries the completion notice for long-pollers.
	DoneSubjectPrefix = "kiln.done."
	// CancelSubject carries cancellation requests (payload: job id) to every worker.
	CancelSubject = "kiln.cancel"
	// ReapSubject asks every worker to remove the sandboxes of a job (payload:
	// job id) whose worker is gone: sent when a redelivery of the job starts.
	ReapSubject = "kiln.reap"
	// HeaderMsgID is JetStream's de-duplication header; Kiln sets it to the job id.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderJobID repeats the job id for consumers that do not parse the body.
	HeaderJobID = "Kiln-Job-Id"
	// HeaderMaxRunning carries the tenant's max_running (its jobs running
	// at once across the fleet) on a job's message, as the API read it from
	// the key file when it queued the job; absent: no bound.
	HeaderMaxRunning = "Kiln-Max-Running"
	// HeaderQueuedAt is when the job's message was first stored in its
	// tenant's backlog (RFC 3339, nanoseconds), carried to its ready
	// message so the queue span starts there.
	HeaderQueuedAt = "Kiln-Queued-At"
)

// JobSubject returns the subject a job for runtime is published on.
func JobSubject(runtime string) string { return SubjectPrefix + runtime }

// DoneSubject returns the subject of a job's completion notice.
func DoneSubject(id string) string { return DoneSubjectPrefix + id }

// VerbatimInJSON reports whether s is written in a JSON string as it is,
// with nothing to escape: letters, digits and hyphens (job and trace ids).
// Answers and records made from templates check it before splicing an id.
func VerbatimInJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// NewID returns a new time-sortable job id (UUIDv7, canonical text form).
func NewID() string {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		panic(fmt.Sprintf("job: crypto/rand failed: %v", err)) // the OS gave no randomness: nothing sane to do
	}
	return id.String()
}

var idPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidID reports whether id has the form NewID produces. Anything else
// (path characters, other lengths) is rejected before it reaches Redis or a subject.
func ValidID(id string) bool { return idPattern.MatchString(id) }
