package job

import (
	"encoding/base64"
	"encoding/json"
	"unicode/utf8"
)

// Live events of a job: published by producers and workers on
// EventsSubject(id), retained for a while by the EventsStreamName stream, and
// served as Server-Sent Events at GET /v1/jobs/{id}/events.
const (
	// EventsStreamName is the JetStream stream retaining jobs' live events.
	EventsStreamName = "KILN_EVENTS"
	// EventsSubjectPrefix + job id carries one job's events.
	EventsSubjectPrefix = "kiln.events."
	// HeaderEvent names the event type of a message on an events subject.
	HeaderEvent = "Kiln-Event"
)

// EventsSubject returns the subject of a job's live events.
func EventsSubject(id string) string { return EventsSubjectPrefix + id }

// Event types (the SSE "event:" field).
const (
	EventStatus    = "status"    // data: StatusEvent
	EventStdout    = "stdout"    // data: OutputEvent
	EventStderr    = "stderr"    // data: OutputEvent
	EventArtifacts = "artifacts" // data: []Artifact
	EventOutput    = "output"    // data: DisplayEvent, one per display output, in order
	EventResult    = "result"    // data: the job's Result; the stream ends after it
	// EventOutputSkipped marks where output the program wrote faster than
	// the live view carries was left out of it (data: SkippedEvent). The
	// stored result has those bytes.
	EventOutputSkipped = "output_skipped"
)

// SkippedEvent is the data of an output_skipped event: Bytes of Stream
// ("stdout" or "stderr") were left out of the live view at this point of
// it. The result's stdout or stderr has them (up to the job's output cap).
type SkippedEvent struct {
	Stream string `json:"stream"`
	Bytes  int64  `json:"bytes"`
}

// EventBatch is the type of a message on an events subject that carries
// several events in order (data: []BatchedEvent). The API serves them one by
// one, each with its own SSE id, so it is never an SSE event type itself. A
// job's end (terminal status, artifacts, result marker) is one batch: one
// stored message instead of three.
const EventBatch = "batch"

// BatchedEvent is one event of an EventBatch message.
type BatchedEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// StatusEvent is the data of a status event.
type StatusEvent struct {
	Status Status `json:"status"`
	Worker string `json:"worker,omitempty"`
}

// OutputEvent is the data of a stdout or stderr event: UTF-8 text in Data,
// or, when the chunk is not valid UTF-8, its exact bytes in DataBase64.
type OutputEvent struct {
	Data       string `json:"data,omitempty"`
	DataBase64 string `json:"data_base64,omitempty"`
}

// NewOutputEvent encodes a chunk of output.
func NewOutputEvent(b []byte) OutputEvent {
	if utf8.Valid(b) {
		return OutputEvent{Data: string(b)}
	}
	return OutputEvent{DataBase64: base64.StdEncoding.EncodeToString(b)}
}

// Bytes returns the chunk's bytes.
func (e OutputEvent) Bytes() ([]byte, error) {
	if e.DataBase64 != "" {
		return base64.StdEncoding.DecodeString(e.DataBase64)
	}
	return []byte(e.Data), nil
}

// MaxDisplayEventBytes bounds one output event's data: an output whose
// values are longer is sent with text/plain only, flagged Partial (the
// result event carries it whole).
const MaxDisplayEventBytes = 512 << 10

// DisplayEvent is the data of an output event: one display output and its
// index in Result.Outputs.
type DisplayEvent struct {
	Index int `json:"index"`
	Output
	// Partial reports that values were left out of this event for size.
	Partial bool `json:"partial,omitempty"`
}
