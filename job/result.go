package job

import (
	"encoding/base64"
	"strings"
	"time"
	"unicode/utf8"
)

// Result is the outcome of a job. JSON field names are public API.
//
// Redaction (package redact) covers every string of a Result, wherever it
// is, unless its field is tagged redact:"platform" (the platform sets it,
// never from the program's words) or redact:"stream" (stdout and stderr,
// redacted as bytes): a new field is redacted without further work.
//
// Output bytes: stdout and stderr are always valid UTF-8 strings, so a Result is
// always valid JSON. When the program wrote bytes that are not valid UTF-8, each
// invalid byte is replaced by U+FFFD in "stdout"/"stderr" and the exact bytes kept
// are given base64-encoded in "stdout_base64"/"stderr_base64".
type Result struct {
	ID              string     `json:"id" redact:"platform"`
	Status          Status     `json:"status" redact:"platform"`
	ExitCode        *int       `json:"exit_code,omitempty"`
	Signal          string     `json:"signal,omitempty" redact:"platform"`
	Stdout          string     `json:"stdout" redact:"stream"`
	Stderr          string     `json:"stderr" redact:"stream"`
	StdoutBase64    string     `json:"stdout_base64,omitempty" redact:"stream"`
	StderrBase64    string     `json:"stderr_base64,omitempty" redact:"stream"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	StdoutBytes     int64      `json:"stdout_bytes"`
	StderrBytes     int64      `json:"stderr_bytes"`
	WallMS          int64      `json:"wall_ms"`
	CPUMS           int64      `json:"cpu_ms"`
	MemoryPeakBytes int64      `json:"memory_peak_bytes"`
	Image           Image      `json:"image" redact:"platform"`
	Error           *Failure   `json:"error,omitempty"`
	Limits          *Limits    `json:"limits,omitempty"`
	Artifacts       []Artifact `json:"artifacts,omitempty"`
	// ArtifactsSkipped lists files of the output dir that were not kept, with
	// the reason (at most MaxSkippedListed entries; ArtifactsSkippedCount counts all).
	ArtifactsSkipped      []SkippedArtifact `json:"artifacts_skipped,omitempty"`
	ArtifactsSkippedCount int               `json:"artifacts_skipped_count,omitempty"`
	// Redactions counts, by kind ("aws_access_key", "secret", "pattern:NAME",
	// ...), the key-like strings the worker replaced anywhere in the result
	// (package redact) before it left it.
	Redactions map[string]int `json:"redactions,omitempty" redact:"platform"`
	// ReplayOf is the job this one replays (POST /v1/jobs/{id}/replay), and
	// Replay how its outcome compares.
	ReplayOf string  `json:"replay_of,omitempty" redact:"platform"`
	Replay   *Replay `json:"replay,omitempty" redact:"platform"`
	// Outputs are the program's display outputs, in the order it made
	// them (see Output). OutputsTruncated reports that some were not kept
	// (over MaxOutputs or MaxOutputsBytes, or not well formed); OutputsDropped
	// counts them.
	Outputs          []Output `json:"outputs,omitempty"`
	OutputsTruncated bool     `json:"outputs_truncated,omitempty"`
	OutputsDropped   int      `json:"outputs_dropped,omitempty"`
	// Egress is what the job did through its egress proxy (a job with a
	// network policy only).
	Egress *Egress `json:"egress,omitempty"`

	// StdoutObject and StderrObject are set, and the stream's text and
	// base64 fields left empty, when that stream was longer than
	// MaxInlineOutputBytes and its bytes were kept in the object store. They
	// are internal to the fleet: an API answer always carries the output
	// itself, read from the object store as it is written.
	StdoutObject *OutputObject `json:"-" redact:"platform"`
	StderrObject *OutputObject `json:"-" redact:"platform"`

	// Set by the pipeline (producer/worker); empty for a direct sandbox run.
	QueueMS    int64      `json:"queue_ms,omitempty"`
	Attempt    int        `json:"attempt,omitempty"`
	Worker     string     `json:"worker,omitempty" redact:"platform"`
	CacheHit   bool       `json:"cache_hit"`
	CreatedAt  *time.Time `json:"created_at,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	TraceID    string     `json:"trace_id,omitempty" redact:"platform"`
}

// Image names the sandbox image a job ran in.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// SetOutput stores captured stdout/stderr bytes following the encoding rule on Result.
func (r *Result) SetOutput(stdout, stderr []byte) {
	r.Stdout, r.StdoutBase64 = encodeOutput(stdout)
	r.Stderr, r.StderrBase64 = encodeOutput(stderr)
}

func encodeOutput(b []byte) (text, b64 string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), base64.StdEncoding.EncodeToString(b)
}

// Code returns the exit code, or -1 when there is none.
func (r Result) Code() int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

// IntPtr is a helper for ExitCode.
func IntPtr(v int) *int { return &v }

// Cacheable reports whether this outcome is deterministic enough to answer
// identical later jobs: a completed run with any exit code. Timeouts, OOM kills,
// cancellations and internal errors are not cached.
func (r Result) Cacheable() bool {
	return r.Status == StatusSucceeded || (r.Status == StatusFailed && r.Error != nil &&
		(r.Error.Category == CategorySyntaxError || r.Error.Category == CategoryRuntimeError))
}
