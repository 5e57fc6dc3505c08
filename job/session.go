package job

import (
	"fmt"
	"maps"
	"time"
)

// Sessions: a session keeps one sandbox's interpreter and /work between
// calls. These are its wire types (HTTP bodies, NATS payloads) and bounds.

// Session defaults and bounds (POST /v1/sessions).
const (
	SessionIdleTimeoutDefault = 600 * time.Second
	SessionMaxLifetimeDefault = 3600 * time.Second
	SessionIdleTimeoutMax     = 24 * time.Hour
	SessionMaxLifetimeMax     = 24 * time.Hour
	// SessionQueueMax bounds the calls of a session accepted and not yet
	// ended; one more is refused (429).
	SessionQueueMax = 16
)

// Session statuses.
const (
	SessionStarting = "starting" // its box is being made
	SessionReady    = "ready"    // serving calls
	SessionMoving   = "moving"   // paused, and coming back on a worker
	SessionPaused   = "paused"   // holds no sandbox: its files are kept; resumed by a call or POST .../resume
	SessionEnded    = "ended"    // deleted, or past its lifetime
)

// What a resumed session brought back (Session.Restored).
const (
	RestoredMemory      = "memory"       // its interpreter's memory: variables and imports
	RestoredFiles       = "files"        // its files in /work, not its variables
	RestoredFilesReplay = "files+replay" // its files, and its successful calls run again
	// RestoredFilesVariables: its files, and its interpreter's variables
	// as the pause kept them (pickled: data, models, functions and classes
	// it defined, modules by name); what could not be kept is named in the
	// next call's session_note.
	RestoredFilesVariables = "files+variables"
)

// Why a session ended (Session.EndedReason).
const (
	SessionEndDeleted     = "deleted"
	SessionEndIdle        = "idle_timeout"
	SessionEndLifetime    = "max_lifetime"
	SessionEndUnavailable = "unavailable"
)

// Session restore modes (SessionSpec.Restore): what a session brings back
// when it comes back on another worker.
const (
	// RestoreFiles (the default): its /work files, and after a pause a
	// python interpreter's variables (RestoredFilesVariables); after its
	// worker's loss, its files alone.
	RestoreFiles  = "files"
	RestoreReplay = "replay" // its files, then its successful calls re-run in order
)

// SessionSpec is the body of POST /v1/sessions.
type SessionSpec struct {
	// Runtime names the language runtime. Default: DefaultRuntime.
	Runtime string `json:"runtime,omitempty"`
	// Limits are every call's default limits (a call may set its own).
	// memory_mb is the session's: MemoryMB.
	Limits Limits `json:"limits,omitzero"`
	// MemoryMB caps the session's sandbox, every call together. Default:
	// the policy's default memory limit.
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// IdleTimeoutS ends the session this long after its last call ended.
	// Default: 600.
	IdleTimeoutS int64 `json:"idle_timeout_s,omitempty"`
	// MaxLifetimeS ends the session this long after its creation, whatever
	// it is doing. Default: 3600.
	MaxLifetimeS int64 `json:"max_lifetime_s,omitempty"`
	// Files are placed in /work before the first call.
	Files []File `json:"files,omitempty"`
	// Restore is "files" (default) or "replay" (see RestoreReplay).
	Restore string `json:"restore,omitempty"`
	// Network allows every call of the session to reach the named hosts
	// through the session's egress proxy, within its tenant's allowance
	// (as a job's Network); nil: no network.
	Network *Network `json:"network,omitempty"`
	// Metadata is the caller's own labels on the session (see Metadata).
	Metadata Metadata `json:"metadata,omitempty"`
	// Env is every call's and every command's environment, under the
	// call's own env (a name the call sets is the call's). Held to a job's
	// env rules, and, as a job's, never shown back: the audit log keeps
	// its hashes.
	Env map[string]string `json:"env,omitempty"`
}

// Normalize applies defaults.
func (s *SessionSpec) Normalize() {
	if s.Runtime == "" {
		s.Runtime = DefaultRuntime
	}
	if s.IdleTimeoutS == 0 {
		s.IdleTimeoutS = int64(SessionIdleTimeoutDefault / time.Second)
	}
	if s.MaxLifetimeS == 0 {
		s.MaxLifetimeS = int64(SessionMaxLifetimeDefault / time.Second)
	}
	if s.Restore == "" {
		s.Restore = RestoreFiles
	}
}

// Validate checks what the spec alone can tell (Normalize first).
func (s SessionSpec) Validate() error {
	switch {
	case s.IdleTimeoutS < 1 || s.IdleTimeoutS > int64(SessionIdleTimeoutMax/time.Second):
		return invalid("idle_timeout_s", fmt.Sprintf("idle_timeout_s is %d; it must be 1 .. %d", s.IdleTimeoutS, int64(SessionIdleTimeoutMax/time.Second)))
	case s.MaxLifetimeS < 1 || s.MaxLifetimeS > int64(SessionMaxLifetimeMax/time.Second):
		return invalid("max_lifetime_s", fmt.Sprintf("max_lifetime_s is %d; it must be 1 .. %d", s.MaxLifetimeS, int64(SessionMaxLifetimeMax/time.Second)))
	case s.MemoryMB < 0:
		return invalid("memory_mb", fmt.Sprintf("memory_mb is %d; it must be positive (or omitted for the default)", s.MemoryMB))
	case s.Restore != RestoreFiles && s.Restore != RestoreReplay:
		return invalid("restore", fmt.Sprintf("restore is %q; it must be %q or %q", s.Restore, RestoreFiles, RestoreReplay))
	case s.Limits.MemoryMB != 0:
		return invalid("limits.memory_mb", "a session's memory is the session's, not a call's: set memory_mb instead")
	}
	if err := validateEnv(s.Env); err != nil {
		return err
	}
	return ValidateMetadata("metadata", s.Metadata)
}

// Session is a session as the API shows it.
type Session struct {
	ID            string    `json:"id"`
	Status        string    `json:"status"`
	Runtime       string    `json:"runtime"`
	Image         Image     `json:"image"`
	CreatedAt     time.Time `json:"created_at"`
	ExpiresAt     time.Time `json:"expires_at"`
	IdleExpiresAt time.Time `json:"idle_expires_at"`
	// Incarnation counts the session's interpreters: +1 each time it
	// started anew (its memory cap, its worker lost).
	Incarnation int `json:"incarnation"`
	// Calls counts the calls accepted.
	Calls        int64    `json:"calls"`
	MemoryMB     int64    `json:"memory_mb"`
	IdleTimeoutS int64    `json:"idle_timeout_s"`
	MaxLifetimeS int64    `json:"max_lifetime_s"`
	Restore      string   `json:"restore"`
	Network      *Network `json:"network,omitempty"`
	EndedReason  string   `json:"ended_reason,omitempty"`
	Metadata     Metadata `json:"metadata,omitempty"`
	// PausedAt is when the session last paused (by POST .../pause, or idle
	// past its idle timeout); Restored says what its last resume brought
	// back: RestoredMemory, RestoredFiles, RestoredFilesReplay or
	// RestoredFilesVariables.
	PausedAt *time.Time        `json:"paused_at,omitempty"`
	Restored string            `json:"restored,omitempty"`
	Links    map[string]string `json:"links,omitempty"`
}

// SessionCall is the body of POST /v1/sessions/{id}/exec.
type SessionCall struct {
	Code   string            `json:"code"`
	Stdin  string            `json:"stdin,omitempty"`
	Args   []string          `json:"args,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	Files  []File            `json:"files,omitempty"`
	Limits Limits            `json:"limits,omitzero"`
	// Budget names a budget of the caller's (POST /v1/budgets) the call's
	// run is charged to, as a job's is; one that cannot cover the call's
	// limits refuses it (ProblemBudgetExhausted).
	Budget string `json:"budget,omitempty"`
	// BudgetHold is the id of the call's reservation of Budget, set by the
	// API as it accepts the call (never by a client: the body's schema
	// refuses it, as it does the fields below); the worker settles it when
	// the call ends.
	BudgetHold string `json:"budget_hold,omitempty"`
	// Redact is the tenant's redaction policy as the API knew it when it
	// accepted the call (as a job's message carries it).
	Redact *RedactPolicy `json:"redact,omitempty"`
	// Quota is the tenant's settings the worker applies to the call (its
	// audit bounds), as a job's message carries them; set by the API.
	Quota *TenantQuota `json:"quota,omitempty"`
	// EventsID names the call's live events (GET
	// /v1/sessions/{id}/calls/{seq}/events) and is its result's id.
	EventsID string `json:"events_id,omitempty"`
	// Trace is the trace context of the API's session.call span (W3C
	// traceparent and baggage), set by the API: the worker's run of the
	// call continues that trace, as a job's message carries its own.
	Trace map[string]string `json:"trace,omitempty"`
	// File makes the call a file operation on the session's /work, done by
	// the worker between calls (no code runs); set by the API's files
	// routes, never in an exec body.
	File *SessionFileOp `json:"file,omitempty"`
	// Command makes the call a shell command (or a wait on, or a kill of,
	// a background one) the session's interpreter runs
	// (session_commands.go); set by the API's commands routes, never in an
	// exec body.
	Command *SessionCommand `json:"command,omitempty"`
}

// Sent is the call as its client sent it, without what the API adds: what
// an Idempotency-Key compares.
func (c SessionCall) Sent() SessionCall {
	c.BudgetHold, c.Redact, c.Quota, c.EventsID, c.Trace = "", nil, nil, "", nil
	return c
}

// UnderEnv is the call with the session's env env under its own: a name
// the call (or its command) sets keeps the call's value. A file operation
// has no environment.
func (c SessionCall) UnderEnv(env map[string]string) SessionCall {
	if len(env) == 0 || c.File != nil {
		return c
	}
	merge := func(own map[string]string) map[string]string {
		m := maps.Clone(env)
		maps.Copy(m, own)
		return m
	}
	if c.Command != nil {
		cmd := *c.Command
		if cmd.Op == CommandRun {
			cmd.Env = merge(cmd.Env)
		}
		c.Command = &cmd
		return c
	}
	c.Env = merge(c.Env)
	return c
}

// Spec is the call as a job spec of runtime, with the session's default
// limits where the call sets none.
func (c SessionCall) Spec(runtime string, defaults Limits) Spec {
	lim := c.Limits
	for _, f := range limitFields {
		if v := f.get(&lim); *v == 0 {
			*v = *f.get(&defaults)
		}
	}
	return Spec{Runtime: runtime, Code: c.Code, Stdin: c.Stdin, Args: c.Args, Env: c.Env, Files: c.Files, Limits: lim, Budget: c.Budget}
}

// CallResult is one call's outcome: a job's Result plus where the call
// stands in its session.
type CallResult struct {
	Result
	// Seq is the call's number in its session (1, 2, ...).
	Seq int64 `json:"seq"`
	// Incarnation is the session's incarnation the call ran in.
	Incarnation int `json:"incarnation"`
	// StateRestored is false when the call did not find the state the
	// session's earlier calls left (its interpreter started anew: the
	// memory cap, a lost worker); SessionNote then says what happened and
	// what to do.
	StateRestored bool   `json:"state_restored"`
	SessionNote   string `json:"session_note,omitempty"`
	// File is the outcome of a call that was a file operation.
	File *SessionFileOutcome `json:"file,omitempty"`
	// Command is where a command call's command stands.
	Command *CommandState `json:"command,omitempty"`
	// Commands are the session's background commands, the answer of a
	// list of them (GET /v1/sessions/{id}/commands), oldest first.
	Commands []CommandState `json:"commands,omitempty"`
}

// Where a call that has not ended stands (CallPending.Status).
const (
	CallQueued  = "queued"  // accepted, waiting for the calls before it
	CallRunning = "running" // running in the session's interpreter
)

// CallPending is the answer (202) for a call accepted that has not ended
// when the wait passed: no result yet, so nothing of one (no id, no
// status of a job, no incarnation or state_restored, which only a call
// that ran can tell).
type CallPending struct {
	Seq int64 `json:"seq"`
	// Status is CallQueued or CallRunning.
	Status string `json:"status"`
	// Pending is always true: it tells this answer from a CallResult.
	Pending bool      `json:"pending"`
	Links   CallLinks `json:"links"`
}

// CallLinks are where a call is read: its result (Self, Wait: a
// long-poll) and its live events.
type CallLinks struct {
	Self   string `json:"self"`
	Wait   string `json:"wait"`
	Events string `json:"events"`
}

// NewCallPending is the pending answer for call seq of session id, in
// state (the call record's: queued or running).
func NewCallPending(id string, seq int64, state string) CallPending {
	if state != CallRunning {
		state = CallQueued
	}
	self := fmt.Sprintf("/v1/sessions/%s/calls/%d", id, seq)
	return CallPending{Seq: seq, Status: state, Pending: true,
		Links: CallLinks{Self: self, Wait: self + "?wait=30s", Events: self + "/events"}}
}

// Session subjects (core NATS). A session lives on one worker; the
// catalog in Redis names it and fences it by incarnation.
const (
	// SessionOpenPrefix + runtime: a request to make (or bring back) a
	// session's box, taken by one worker of the queue group
	// SessionOpenQueue that has room.
	SessionOpenPrefix = "kiln.sessions.open."
	SessionOpenQueue  = "kiln-sessions"
	// SessionWorkerPrefix + worker id: "look at session <id>" (new calls,
	// deletion) for the worker holding it. Sent as a request, it is also
	// the question whether that worker process holds the session: the
	// answer is SessionHeld (an empty answer: it does not; no responder:
	// the process is gone).
	SessionWorkerPrefix = "kiln.sessions.worker."
	// SessionHeld is a worker's answer to a SessionWorkerPrefix request
	// for a session it holds.
	SessionHeld = "held"
	// SessionDonePrefix + session id: a call of it ended (payload: seq).
	SessionDonePrefix = "kiln.sessions.done."
)

// SessionOpen is the payload of a SessionOpenPrefix request.
type SessionOpen struct {
	ID string `json:"id"`
	// Tenant and MemoryMB are the session's, so a worker admits it against
	// what it may use before claiming it (empty from APIs of earlier
	// versions: the worker then reads them from the catalog).
	Tenant   string `json:"tenant,omitempty"`
	MemoryMB int64  `json:"memory_mb,omitempty"`
}

// SessionOpened is a worker's answer to SessionOpen.
type SessionOpened struct {
	Worker string `json:"worker,omitempty"`
	Error  string `json:"error,omitempty"`
	// Invalid: the error is the request's (422), not the fleet's.
	Invalid bool `json:"invalid,omitempty"`
	// TenantFull: the worker has room, but not within the tenant's share
	// of its session memory.
	TenantFull bool `json:"tenant_full,omitempty"`
}

// SessionFileEntry is one entry of a session's checkpoint: a file (its
// content an object of the object store named by its SHA-256), a
// directory or a symbolic link (listed, not restored).
type SessionFileEntry struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256,omitempty"`
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"`
	// Type is FileTypeDir or FileTypeSymlink; "" (or FileTypeFile) for a
	// file.
	Type  string    `json:"type,omitempty"`
	MTime time.Time `json:"mtime,omitzero"`
}
