package producer

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A session's shell commands (job/session_commands.go): each route accepts
// a call of the session whose Command the worker turns into code for the
// session's interpreter, and answers as calls are answered (the call's
// result, with where the command stands in command; 202 while it waits or
// runs past ?wait=, its output live at the call's events).

// commandRoutes serve a session's commands (/v1/sessions/{id}/commands).
type commandRoutes struct{ ss *sessions }

var (
	commandSchema = &fieldSchema{fields: map[string]*fieldSchema{"cmd": nil, "timeout_s": nil, "background": nil, "env": {mapNames: true}, "stdin": nil}}
	stdinSchema   = &fieldSchema{fields: map[string]*fieldSchema{"data": nil, "close": nil}}
)

// handleSessionCommand runs a command line: POST /v1/sessions/{id}/commands.
func (cm commandRoutes) handleSessionCommand(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	var req job.CommandRequest
	wait, ok := cm.ss.waitAndBody(w, r, &req, commandSchema)
	if !ok {
		return
	}
	if err := req.Validate(); err != nil {
		writeProblem(w, cm.ss.problems.toProblem(ctx, "command", err))
		return
	}
	call := job.SessionCall{Limits: job.Limits{TimeoutMS: int64(req.TimeoutS) * 1000},
		Command: &job.SessionCommand{Cmd: req.Cmd, Background: req.Background, Env: req.Env, Stdin: req.Stdin}}
	cm.commandCall(w, r, caller, call, wait)
}

// handleSessionCommandList lists the session's background commands (the
// ones its interpreter holds, running or ended): GET
// /v1/sessions/{id}/commands.
func (cm commandRoutes) handleSessionCommandList(w http.ResponseWriter, r *http.Request, caller string) {
	wait, p := cm.ss.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	cm.commandCall(w, r, caller, job.SessionCall{Command: &job.SessionCommand{Op: job.CommandList}}, wait)
}

// handleSessionCommandStdin writes to a background command's stdin and
// closes it when asked: POST /v1/sessions/{id}/commands/{cid}/stdin.
func (cm commandRoutes) handleSessionCommandStdin(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	cid := r.PathValue("cid")
	if !job.ValidCommandID(cid) {
		writeProblem(w, cm.ss.problems.toProblem(ctx, "command", commandNotFound(r.PathValue("id"), cid)))
		return
	}
	var req job.StdinRequest
	wait, ok := cm.ss.waitAndBody(w, r, &req, stdinSchema)
	if !ok {
		return
	}
	if err := req.Validate(); err != nil {
		writeProblem(w, cm.ss.problems.toProblem(ctx, "stdin", err))
		return
	}
	cm.commandCall(w, r, caller, job.SessionCall{Command: &job.SessionCommand{Op: job.CommandInput, ID: cid,
		Input: []byte(req.Data), CloseStdin: req.Close}}, wait)
}

// handleSessionCommandGet waits (?wait=, at most job.CommandWaitMaxMS) for a
// background command and answers where it stands with its output so far:
// GET /v1/sessions/{id}/commands/{cid}.
func (cm commandRoutes) handleSessionCommandGet(w http.ResponseWriter, r *http.Request, caller string) {
	cm.backgroundCommand(w, r, caller, job.CommandWait)
}

// handleSessionCommandKill kills a background command: POST
// /v1/sessions/{id}/commands/{cid}/kill.
func (cm commandRoutes) handleSessionCommandKill(w http.ResponseWriter, r *http.Request, caller string) {
	cm.backgroundCommand(w, r, caller, job.CommandKill)
}

func (cm commandRoutes) backgroundCommand(w http.ResponseWriter, r *http.Request, caller, op string) {
	ctx := r.Context()
	cid := r.PathValue("cid")
	if !job.ValidCommandID(cid) {
		writeProblem(w, cm.ss.problems.toProblem(ctx, "command", commandNotFound(r.PathValue("id"), cid)))
		return
	}
	wait, p := cm.ss.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	c := &job.SessionCommand{Op: op, ID: cid}
	call := job.SessionCall{Command: c}
	if op == job.CommandWait {
		c.WaitMS = min(wait.Milliseconds(), job.CommandWaitMaxMS)
		// The call's own timeout outlasts the wait.
		call.Limits.TimeoutMS = c.WaitMS + 30_000
	}
	cm.commandCall(w, r, caller, call, cm.ss.cfg.MaxWait)
}

// commandCall accepts call and answers it: its result (a background
// command the interpreter does not know is 404), or 202 past wait.
func (cm commandRoutes) commandCall(w http.ResponseWriter, r *http.Request, caller string, call job.SessionCall, wait time.Duration) {
	ctx := cm.ss.traced(r)
	ans, p := cm.ss.runSessionCall(ctx, caller, r.PathValue("id"), call, r.Header.Get("Idempotency-Key"), wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	if err := commandRefusal(r.PathValue("id"), ans); err != nil {
		writeProblem(w, cm.ss.problems.toProblem(ctx, "command", err))
		return
	}
	writeCallAnswer(w, ans)
}

// commandRefusal is the refusal a command call's answer holds: a
// background command the interpreter does not know, or a stdin it found
// closed.
func commandRefusal(session string, ans callAnswer) error {
	c := ans.res.Command
	switch {
	case ans.pending != nil || c == nil:
		return nil
	case c.Missing:
		return commandNotFound(session, c.ID)
	case c.StdinClosed:
		return &refusal{kind: errStdinClosed, field: "cid", detail: fmt.Sprintf(
			"command %s of session %s has no open stdin (started without stdin true, closed, or no longer reading it): not all of the input was written", c.ID, session)}
	}
	return nil
}

// commandNotFound is the refusal of a background command the session's
// interpreter does not hold.
func commandNotFound(session, cid string) error {
	return &refusal{kind: errCommandNotFound, field: "cid", detail: fmt.Sprintf(
		"session %s has no background command %q: its id is the seq of the call that started it, and an interpreter that started anew (state_restored false) has none of its predecessor's", session, cid)}
}
