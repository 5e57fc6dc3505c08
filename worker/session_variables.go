package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// A paused python session keeps its interpreter's variables: before the
// pause's checkpoint, a call of the session (in its sandbox, as its uid,
// under its limits) pickles the globals of its namespace into
// /work/job.SessionVariablesFile, which the checkpoint keeps with the
// session's files; the first thing the resumed interpreter runs loads them
// back and removes the file. Modules are kept by name and imported again;
// functions and classes the session defined are kept by value where
// cloudpickle is in the image (joblib's copy), by name otherwise; what does
// not pickle (open files, generators, sockets, threads) is named in the
// resumed session's note. The worker never unpickles anything: the pickle
// is made and read inside the session's own sandbox.

// variablesTimeout bounds the calls that save and load the variables.
const variablesTimeout = 60 * time.Second

// saveVariablesSource pickles the session's namespace into PATH, at most
// BUDGET bytes, and prints a variablesReport. It runs in a namespace of its
// own (variablesCode), so the session's names neither shadow its builtins
// nor gain any of its own.
const saveVariablesSource = `import json, os, pickle, sys, types
try:
    from joblib.externals import cloudpickle
    dumps = cloudpickle.dumps
except Exception:
    def dumps(v):
        return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
g = sys.modules["__main__"].__dict__
modules, values, lost = {}, {}, {}
for name, value in list(g.items()):
    if name.startswith("__") and name.endswith("__"):
        continue
    if isinstance(value, types.ModuleType):
        modules[name] = value.__name__
    else:
        values[name] = value
try:
    blob = dumps(values)
except Exception:
    for name in list(values):
        try:
            dumps(values[name])
        except Exception as e:
            lost[name] = ("%s: %s" % (type(e).__name__, e))[:200]
            del values[name]
    try:
        blob = dumps(values)
    except Exception as e:
        lost.update({name: ("%s: %s" % (type(e).__name__, e))[:200] for name in values})
        values, blob = {}, dumps({})
state = pickle.dumps({"modules": modules, "values": blob, "lost": lost}, protocol=pickle.HIGHEST_PROTOCOL)
if len(state) > BUDGET:
    # Kept: only why nothing was.
    why = "too large to keep: %d bytes, over the %d the session's checkpoint has left" % (len(state), BUDGET)
    lost.update({name: why for name in list(modules) + list(values)})
    modules, values = {}, {}
    state = pickle.dumps({"modules": {}, "values": dumps({}), "lost": lost}, protocol=pickle.HIGHEST_PROTOCOL)
with open(PATH + ".tmp", "wb") as f:
    f.write(state)
os.replace(PATH + ".tmp", PATH)
sys.stdout.write("\n" + json.dumps({"kept": sorted(list(modules) + list(values)), "lost": lost}) + "\n")
`

// loadVariablesSource loads what saveVariablesSource kept at PATH into
// the session's namespace, removes the file, and prints a variablesReport
// (with what the save could not keep).
const loadVariablesSource = `import importlib, json, os, pickle, sys
g = sys.modules["__main__"].__dict__
try:
    with open(PATH, "rb") as f:
        state = pickle.load(f)
finally:
    os.unlink(PATH)
lost = dict(state.get("lost") or {})
kept = []
for name, module in state["modules"].items():
    try:
        g[name] = importlib.import_module(module)
        kept.append(name)
    except Exception as e:
        lost[name] = ("%s: %s" % (type(e).__name__, e))[:200]
try:
    values = pickle.loads(state["values"])
    g.update(values)
    kept.extend(values)
except Exception as e:
    lost["*"] = ("the variables could not be loaded: %s: %s" % (type(e).__name__, e))[:200]
sys.stdout.write("\n" + json.dumps({"kept": sorted(kept), "lost": lost}) + "\n")
`

// variablesCode is a session call that runs source (the save or the load)
// in a namespace of its own, holding PATH and BUDGET. It is one statement
// whose value is None: the call displays nothing.
func variablesCode(source string, budget int64) string {
	return fmt.Sprintf(`(lambda b: b.exec(b.compile(%s, "<kiln variables>", "exec"), {"__builtins__": b, "PATH": %s, "BUDGET": %d}))(__import__("builtins"))`,
		strconv.QuoteToASCII(source), strconv.QuoteToASCII("/work/"+job.SessionVariablesFile), budget)
}

// variablesReport is what the save and load calls print.
type variablesReport struct {
	Kept []string          `json:"kept"`
	Lost map[string]string `json:"lost"`
}

// keepsVariables reports whether a pause keeps the session's variables:
// its interpreter is python, and its restore is not "replay" (which
// rebuilds them by running its calls again).
func (h *sessionHost) keepsVariables(ctx context.Context, ls *liveSession) bool {
	if ls.rec.Restore == job.RestoreReplay {
		return false
	}
	info, err := h.w.registry.info(ctx, ls.rec.Runtime)
	return err == nil && info.Language == "python"
}

// saveVariables runs the save call before a pause's checkpoint. A session
// whose variables could not be saved (the call failed) still pauses: it
// comes back with its files, and its note says its variables are gone.
func (h *sessionHost) saveVariables(ctx context.Context, ls *liveSession, log *slog.Logger) {
	if !ls.box.Alive() || !h.keepsVariables(ctx, ls) {
		return
	}
	var held int64
	for _, e := range ls.files {
		if e.Name != job.SessionVariablesFile {
			held += e.Size
		}
	}
	rep, err := h.variablesCall(ctx, ls, variablesCode(saveVariablesSource, max(SessionFilesMaxSize-held, 0)))
	if err != nil {
		log.WarnContext(ctx, "session: keep the variables before pausing", slog.Any("error", err))
		return
	}
	log.DebugContext(ctx, "session: variables kept for the pause", slog.Int("kept", len(rep.Kept)), slog.Int("lost", len(rep.Lost)))
}

// restoreVariables brings back the variables a pause kept (v, the file
// of its checkpoint): it writes the file into /work and runs the load,
// which removes it.
func (h *sessionHost) restoreVariables(ctx context.Context, ls *liveSession, v job.SessionFileEntry) (variablesReport, error) {
	err := h.putFiles(ctx, ls, []job.SessionFileEntry{v})
	delete(ls.files, v.Name)
	if err != nil {
		return variablesReport{}, err
	}
	rep, err := h.variablesCall(ctx, ls, variablesCode(loadVariablesSource, 0))
	if why, ok := rep.Lost["*"]; ok && err == nil {
		err = errors.New(why)
	}
	return rep, err
}

// variablesCall runs code (the save or the load) as a call of the
// session's interpreter and reads its report.
func (h *sessionHost) variablesCall(ctx context.Context, ls *liveSession, code string) (variablesReport, error) {
	spec := job.Spec{Runtime: ls.rec.Runtime, Code: code, Limits: ls.rec.Limits}
	spec.Limits.TimeoutMS = variablesTimeout.Milliseconds()
	res, _, err := ls.box.Exec(ctx, sandboxapi.Request{ID: job.NewID(), Spec: spec, Tenant: ls.rec.Tenant})
	if err != nil {
		return variablesReport{}, err
	}
	if res.Status != job.StatusSucceeded {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Message
		}
		return variablesReport{}, fmt.Errorf("the call ended %s", msg)
	}
	var rep variablesReport
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		return variablesReport{}, fmt.Errorf("its report %q: %w", res.Stdout, err)
	}
	return rep, nil
}

// lostNote names the variables a resume did not bring back, and why.
func (rep variablesReport) lostNote() string {
	names := make([]string, 0, len(rep.Lost))
	for n := range rep.Lost {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, n+" ("+rep.Lost[n]+")")
	}
	return strings.Join(parts, ", ")
}
