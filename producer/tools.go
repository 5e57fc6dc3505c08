package producer

import (
	"net/http"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
)

// handleTools answers GET /v1/tools?format=anthropic|openai|openai-responses:
// one run tool per registered runtime (run_python, ...), in that API's tool
// schema, ready to pass as the request's "tools". A caller that will send
// its calls with Kiln-Session-Id (any value) sends it here too, and gets
// tools that say what persists between calls.
func (tr *toolRoutes) handleTools(w http.ResponseWriter, r *http.Request, _ string) {
	f, err := tooluse.ParseFormat(r.URL.Query().Get("format"))
	if err != nil {
		writeProblem(w, badParam("format", err.Error()))
		return
	}
	defs, p := tr.toolDefinitions(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	inSession := r.Header.Get(HeaderSessionID) != ""
	tools := make([]map[string]any, len(defs))
	for i, d := range defs {
		if inSession {
			d = d.InSession()
		}
		tools[i] = d.Render(f)
	}
	writeJSON(w, http.StatusOK, map[string]any{"format": f, "tools": tools})
}

// toolDefinitions derives the run tools from the runtime registry, so a
// runtime a worker registers appears as a tool without a change here.
func (tr *toolRoutes) toolDefinitions(r *http.Request) ([]tooluse.Definition, *problem) {
	snap, err := tr.runtimes.current(r.Context())
	if err != nil {
		return nil, tr.problems.storeProblem(r.Context(), "list runtimes", err)
	}
	return tooluse.Definitions(snap.list), nil
}

// handleRuntimes answers GET /v1/runtimes with the registered runtimes and
// the limits policy that applies to each.
func (tr *toolRoutes) handleRuntimes(w http.ResponseWriter, r *http.Request, _ string) {
	snap, err := tr.runtimes.current(r.Context())
	if err != nil {
		writeProblem(w, tr.problems.storeProblem(r.Context(), "list runtimes", err))
		return
	}
	list := snap.list
	if list == nil {
		list = []job.RuntimeInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"runtimes": list})
}
