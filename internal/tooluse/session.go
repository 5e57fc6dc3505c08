package tooluse

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// RenderCall renders a session call's result for the model: the job's
// result, then the session it ran in and, when the call did not find the
// state of the earlier calls, what happened and what to do.
func RenderCall(sessionID string, cr job.CallResult, maxTimeoutS string) Reply {
	out := render(cr.Result, maxTimeoutS, fmt.Sprintf("/v1/sessions/%s/calls/%d", url.PathEscape(sessionID), cr.Seq))
	var b strings.Builder
	b.WriteString(out.Text)
	fmt.Fprintf(&b, "session_id: %s\nseq: %d\nstate_restored: %t\n", sessionID, cr.Seq, cr.StateRestored)
	if cr.SessionNote != "" {
		fmt.Fprintf(&b, "session_note: %s\n", cr.SessionNote)
	}
	out.Text = b.String()
	return out
}

// InSession is d as a tool whose calls share one session (MCP with
// sessions on; /v1/tools for a caller sending Kiln-Session-Id): its
// description says what persists between calls instead of "nothing
// persists".
func (d Definition) InSession() Definition {
	d.Description = "Run " + languageName(d.Runtime) + " code in this conversation's sandbox, which is kept between calls: variables, imports, " +
		"functions, the current directory and files in /work persist, so load data once and build on it " +
		"step by step. Each call returns its standard output, standard error, display outputs, exit code and wall time; " +
		"state_restored: false means the earlier state is gone (session_note says why): run again what you need. " +
		"No network access. (" + d.Title + ")"
	return d
}

// QuotaRefused is the reply to a call a quota or cap of the caller's
// refused before it ran (problem type quotaType, a job.ProblemQuotaPrefix
// type or budget-exhausted; detail the API's words): not a fault, so not
// internal, and not worth the same call again unless the API said when
// (retryAfter, for a rate).
func QuotaRefused(quotaType, detail string, retryAfter time.Duration) Reply {
	what := "a quota of this API key does not allow this run now; do not retry: tell the user, who can raise it"
	retry := false
	switch quotaType {
	case job.QuotaProblemType(job.QuotaRate):
		what = "this API key submits faster than its rate allows; make the same call again after the wait"
		if retryAfter > 0 {
			what = fmt.Sprintf("this API key submits faster than its rate allows; wait %s, then make the same call again", retryAfter)
		}
		retry = true
	case job.QuotaProblemType(job.QuotaQueued):
		what = "this API key has as many jobs waiting as it may; wait for some to finish before calling again (do not retry at once)"
	case job.QuotaProblemType(job.QuotaCPUDay):
		what = "this API key's CPU time for the day is used up; stop running code until it renews (UTC midnight), or ask the user to raise cpu_seconds_per_day"
	case job.ProblemQuotaPrefix + "sessions":
		what = "this API key holds as many live sessions as it may; end one (or let one expire) before starting another"
	case string(job.ProblemBudgetExhausted):
		what = "the execution budget this tool charges is used up; do not retry: the user must give a new budget"
	}
	return Reply{IsError: true, Text: fmt.Sprintf("status: not run\nerror_category: %s\nerror: %s\n"+
		"retry_with_changed_code_can_help: no\nretry_same_call_can_help: %t\nwhat_to_do: %s\n",
		job.CategoryQuota, detail, retry, what)}
}

// SessionCall is the call a run tool's input asks for in a session.
func (in Input) SessionCall() job.SessionCall {
	s := in.Spec("")
	return job.SessionCall{Code: s.Code, Stdin: s.Stdin, Files: s.Files, Limits: s.Limits}
}
