package tooluse

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// RenderCall renders a session call's result for the model: the job's
// result, then the session it ran in and, when the call did not find the
// state of the earlier calls, what happened and what to do.
func RenderCall(sessionID string, cr job.CallResult, maxTimeoutS string) Outcome {
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

// SessionCall is the call a run tool's input asks for in a session.
func (in Input) SessionCall() job.SessionCall {
	s := in.Spec("")
	return job.SessionCall{Code: s.Code, Stdin: s.Stdin, Files: s.Files, Limits: s.Limits}
}
