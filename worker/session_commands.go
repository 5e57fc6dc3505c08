package worker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/kilnrun/kiln/job"
)

// A session's commands (job/session_commands.go) are calls whose code the
// worker makes here: a call of the launcher's commands module
// (deploy/images/python/commands.py) in the session's interpreter, which
// runs the command with its shell under the session's sandbox and says
// where the command stands in one display output of type commandMIME,
// taken out of the call's result into CallResult.Command.

const commandMIME = "application/vnd.kiln.command+json"

// commandCode is the code of call seq, the command c, for the session's
// interpreter (a session relayed to another interpreter runs it in its
// relay: deploy/images/python/relay.py knows its start, COMMAND_CALL). Its parameters go as one string literal of JSON (ASCII, so
// a Python string literal too); the trailing semicolon keeps the call's
// value from being shown.
func commandCode(seq int64, c *job.SessionCommand) (string, error) {
	p := map[string]any{"op": c.Op, "cmd": c.Cmd, "background": c.Background, "env": c.Env, "id": c.ID, "wait_ms": c.WaitMS,
		"stdin": c.Stdin, "input": c.Input, "close_stdin": c.CloseStdin}
	if c.Op == job.CommandRun && c.Background {
		p["id"] = strconv.FormatInt(seq, 10)
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode command: %w", err)
	}
	return `__import__("sys").modules["_kiln_commands"].call(` + strconv.QuoteToASCII(string(raw)) + `);`, nil
}

// commandReport is what the commands module says of a command call: where
// its command stands, and for a list, every background command.
type commandReport struct {
	job.CommandState
	Commands []job.CommandState `json:"commands"`
}

// commandState takes the command's state out of res's display outputs
// (and a list's commands). A call that ended without one (its interpreter
// lost, a timeout) says only what its result says.
func commandState(c *job.SessionCommand, res *job.Result) (*job.CommandState, []job.CommandState) {
	var rep *commandReport
	res.Outputs = slices.DeleteFunc(res.Outputs, func(o job.Output) bool {
		raw, ok := o.Data[commandMIME]
		if !ok {
			return false
		}
		var r commandReport
		if json.Unmarshal(raw, &r) == nil && rep == nil {
			rep = &r
		}
		return true
	})
	if rep != nil && c.Op == job.CommandList {
		if rep.Commands == nil {
			rep.Commands = []job.CommandState{}
		}
		return nil, rep.Commands
	}
	if rep != nil {
		return &rep.CommandState, nil
	}
	if c.Op == job.CommandList {
		return nil, nil
	}
	st := &job.CommandState{ID: c.ID, Background: c.Background || c.Op != job.CommandRun}
	if c.Op == job.CommandRun && !c.Background {
		st.ExitCode = res.ExitCode
	}
	return st, nil
}
