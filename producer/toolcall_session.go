package producer

import (
	"context"
	"net/http"
	"time"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
)

// Tool calls in a session: a caller that sends Kiln-Session-Id with a tool
// call has it run as the next call of that session (or of a new one, for
// "new"), so what one call leaves (variables, imports, files) the next
// finds. The answer names the session in the same header and in the
// tool result's text.

// HeaderSessionID carries a session id on /v1/tool-calls, in and out.
const HeaderSessionID = "Kiln-Session-Id"

// sessionToolCall runs a decoded tool call in session sid ("new": a new
// session of the tool's runtime) and returns the reply and the session's
// id, or the problem to answer.
func (tr *toolRoutes) sessionToolCall(ctx context.Context, call tooluse.Call, caller, sid, idem, budgetID string, budget func(time.Duration) time.Duration) (tooluse.Reply, string, *problem) {
	if call.InputErr != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, call.InputErr.Error()), sid, nil
	}
	snap, err := tr.runtimes.current(ctx)
	if err != nil {
		return tooluse.Reply{}, sid, tr.problems.storeProblem(ctx, "list runtimes", err)
	}
	def, err := tooluse.Lookup(tooluse.Definitions(snap.list), call.Name)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, err.Error()), sid, nil
	}
	in, err := tooluse.DecodeInput(call.Input)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, err.Error()), sid, nil
	}
	rt := snap.byName[def.Runtime]
	if sid == "new" {
		st, p := tr.sessions.sessionStore()
		if p != nil {
			return tooluse.Reply{}, "", p
		}
		rec, p := tr.sessions.createSession(ctx, st, caller, job.SessionSpec{Runtime: def.Runtime})
		if p != nil {
			return tooluse.Reply{}, "", p
		}
		sid = rec.ID
	}
	sc := in.SessionCall()
	sc.Budget = budgetID
	lim, err := rt.Limits.Resolve(sc.Limits)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, inputMessage(err)), sid, nil
	}
	ans, p := tr.sessions.runSessionCall(ctx, caller, sid, sc, idem, budget(lim.Timeout()+tr.cfg.ToolCallQueueSlack))
	if p != nil && p.Status == http.StatusUnprocessableEntity {
		// The model's input: it can fix it.
		return tooluse.Failed(job.CategoryInvalidRequest, p.Field+": "+p.Detail), sid, nil
	}
	if p != nil {
		return tooluse.Reply{}, sid, p
	}
	if ans.pending != nil {
		return tooluse.Unfinished(sid, job.Status(ans.pending.Status), lim.Timeout().String()), sid, nil
	}
	res := ans.res
	if err := tr.results.loadOutput(ctx, &res.Result); err != nil {
		return tooluse.Reply{}, sid, tr.results.outputProblem(ctx, res.ID, err)
	}
	return tooluse.RenderCall(sid, res, formatSeconds(rt.Limits.Max.TimeoutMS)), sid, nil
}
