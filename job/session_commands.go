package job

import (
	"fmt"
	"strconv"
	"strings"
)

// A session's shell commands (POST /v1/sessions/{id}/commands): a command
// is a call of the session, ordered with the others, that the session's
// interpreter runs with its shell in the session's sandbox (cwd /work, the
// session's limits); its stdout and stderr are the call's, streamed as a
// call's are. A background command is started by its call and runs on
// after it; its id is the seq of the call that started it, and later calls
// wait on it, write to its stdin (when it was started with one), kill it,
// or list the session's background commands.

// What a command call does (SessionCommand.Op).
const (
	CommandRun  = ""     // run Cmd (in the background when Background)
	CommandWait = "wait" // wait (at most WaitMS) for background command ID
	CommandKill = "kill" // kill background command ID
	// CommandInput writes Input to background command ID's stdin, then
	// closes it when CloseStdin.
	CommandInput = "input"
	// CommandList lists the interpreter's background commands.
	CommandList = "list"
)

// Command bounds.
const (
	// MaxCommandBytes bounds a command line.
	MaxCommandBytes = 64 << 10
	// CommandWaitMaxMS bounds how long one wait on a background command
	// holds the session (its calls wait behind it).
	CommandWaitMaxMS = 60_000
	// MaxCommandInputBytes bounds what one write to a command's stdin carries.
	MaxCommandInputBytes = 64 << 10
)

// CommandRequest is the body of POST /v1/sessions/{id}/commands.
type CommandRequest struct {
	Cmd        string            `json:"cmd"`
	TimeoutS   int               `json:"timeout_s,omitempty"`
	Background bool              `json:"background,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	// Stdin gives a background command a stdin the session keeps open:
	// POST .../commands/{cid}/stdin writes to it and closes it. Without
	// it a command's stdin is empty.
	Stdin bool `json:"stdin,omitempty"`
}

// Validate checks the request on its own.
func (r CommandRequest) Validate() error {
	switch {
	case r.Cmd == "":
		return &InvalidError{Field: "cmd", Message: "cmd is empty: send a shell command line such as \"ls -la\""}
	case len(r.Cmd) > MaxCommandBytes:
		return &InvalidError{Field: "cmd", Message: fmt.Sprintf("cmd is %d bytes, over the %d allowed", len(r.Cmd), MaxCommandBytes)}
	case r.TimeoutS < 0:
		return &InvalidError{Field: "timeout_s", Message: "timeout_s is negative"}
	case r.Background && r.TimeoutS != 0:
		return &InvalidError{Field: "timeout_s", Message: "a background command has no timeout: wait on it, or kill it (POST .../commands/{cid}/kill)"}
	case r.Stdin && !r.Background:
		return &InvalidError{Field: "stdin", Message: "only a background command has a stdin to write to: send background true with it"}
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return &InvalidError{Field: "env", Message: fmt.Sprintf("env %q: a name is not empty and holds no = or NUL, a value no NUL", k)}
		}
	}
	if strings.ContainsRune(r.Cmd, 0) {
		return &InvalidError{Field: "cmd", Message: "cmd holds a NUL byte"}
	}
	return nil
}

// SessionCommand makes a session call a command (SessionCall.Command): set
// by the API's command routes, never in an exec body. The worker turns it
// into the code its interpreter runs.
type SessionCommand struct {
	Op         string            `json:"op,omitempty"`
	Cmd        string            `json:"cmd,omitempty"`
	Background bool              `json:"background,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	// Stdin: a background command started with a stdin to write to.
	Stdin bool `json:"stdin,omitempty"`
	// ID names the background command a wait, kill or input is about.
	ID string `json:"id,omitempty"`
	// WaitMS is how long a wait waits for the command to end.
	WaitMS int64 `json:"wait_ms,omitempty"`
	// Input is what an input writes to the command's stdin; CloseStdin
	// closes its stdin after it.
	Input      []byte `json:"input,omitempty"`
	CloseStdin bool   `json:"close_stdin,omitempty"`
}

// StdinRequest is the body of POST /v1/sessions/{id}/commands/{cid}/stdin.
type StdinRequest struct {
	// Data is written to the command's stdin as it is (UTF-8 text).
	Data string `json:"data,omitempty"`
	// Close closes the command's stdin after Data: the command reads the
	// end of its input.
	Close bool `json:"close,omitempty"`
}

// Validate checks the request on its own.
func (r StdinRequest) Validate() error {
	switch {
	case r.Data == "" && !r.Close:
		return &InvalidError{Field: "data", Message: "nothing to do: send data to write, close true to close the command's stdin, or both"}
	case len(r.Data) > MaxCommandInputBytes:
		return &InvalidError{Field: "data", Message: fmt.Sprintf("data is %d bytes, over the %d one write carries: send it in parts", len(r.Data), MaxCommandInputBytes)}
	}
	return nil
}

// Describe is the command as the audit log records it.
func (c *SessionCommand) Describe() string {
	if c == nil {
		return ""
	}
	switch c.Op {
	case CommandWait, CommandKill:
		return "command " + c.Op + " " + c.ID
	case CommandInput:
		d := fmt.Sprintf("command input %s (%d bytes)", c.ID, len(c.Input))
		if c.CloseStdin {
			d += ", stdin closed"
		}
		return d
	case CommandList:
		return "command list"
	}
	if c.Background {
		return "command (background): " + c.Cmd
	}
	return "command: " + c.Cmd
}

// ValidCommandID reports whether id can name a background command: the
// seq of the call that started it.
func ValidCommandID(id string) bool {
	n, err := strconv.ParseInt(id, 10, 64)
	return err == nil && n > 0 && strconv.FormatInt(n, 10) == id
}

// CommandState is where a command stands (CallResult.Command): a
// foreground command's call ended with it; a background one's ID waits on
// it or kills it.
type CommandState struct {
	// ID is a background command's id (the seq of the call that started
	// it); empty for a foreground command.
	ID         string `json:"id,omitempty"`
	Background bool   `json:"background,omitempty"`
	// Running: the command had not ended when the call did.
	Running bool `json:"running"`
	// ExitCode is the command's exit status once it has ended (128+n when
	// ended by signal n).
	ExitCode *int `json:"exit_code,omitempty"`
	// Killed: a kill ended it.
	Killed bool `json:"killed,omitempty"`
	// Missing: the session's interpreter knows no background command ID
	// (never started, or lost with an interpreter that started anew).
	Missing bool `json:"missing,omitempty"`
	// Cmd is a background command's command line (in a list of the
	// session's commands).
	Cmd string `json:"cmd,omitempty"`
	// Stdin: the command's stdin is open for writing (it was started with
	// stdin, and neither closed nor ended).
	Stdin bool `json:"stdin,omitempty"`
	// StdinClosed: an input found the command's stdin closed (started
	// without one, closed before, or no longer read by the command), so
	// not all of it was written.
	StdinClosed bool `json:"stdin_closed,omitempty"`
}
