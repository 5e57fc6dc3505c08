package e2bapi

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// Code contexts. A sandbox's own context (defaultContext) is its session's
// python interpreter. Every other context is a session of its own, of the
// context's language's runtime, made for the sandbox: its metadata names
// the sandbox (metaContextOf) and the language (metaLanguage), it is never
// listed or reached as a sandbox, it ends with its sandbox, and its id is
// the context's. A context runs in a sandbox of its own: it has its own
// /work, not the sandbox's (docs/e2b.md).

// The metadata keys of a context's session.
const (
	metaContextOf = "e2b.context_of"
	metaLanguage  = "e2b.language"
	// metaDefault marks the context runCode takes for a language named
	// without a context.
	metaDefault = "e2b.default"
)

// languages maps E2B's language names to the language a context shows and
// the runtime that runs it.
var languages = map[string]struct{ name, runtime string }{
	"":           {"python", "python"},
	"python":     {"python", "python"},
	"python3":    {"python", "python"},
	"javascript": {"javascript", "node"},
	"js":         {"javascript", "node"},
	"node":       {"javascript", "node"},
}

// languageOf is E2B language l as a context's language and runtime.
func languageOf(l string) (name, runtime string, err error) {
	lang, ok := languages[strings.ToLower(strings.TrimSpace(l))]
	if !ok {
		return "", "", fmt.Errorf("language %q is not served by Kiln: python or javascript (docs/e2b.md)", l)
	}
	return lang.name, lang.runtime, nil
}

// codeContext is E2B's code context.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// isContext reports whether session v is a context's rather than a sandbox.
func isContext(v job.Session) bool { return v.Metadata[metaContextOf] != "" }

// contextSession is the session a call of sandbox id runs in: the context
// ctx names, or for none, language's default (the sandbox's own session
// for python; a javascript context made on first use). ok false: the
// answer is written.
func (s *Surface) contextSession(w http.ResponseWriter, r *http.Request, tenant, id, ctx, language string) (string, bool) {
	if ctx != "" && language != "" {
		writeText(w, http.StatusBadRequest, "give a context or a language, not both")
		return "", false
	}
	if ctx == defaultContext {
		return id, true
	}
	if ctx != "" {
		v, ok := s.context(w, r, tenant, id, ctx)
		return v.ID, ok
	}
	name, runtime, err := languageOf(language)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	if runtime == "python" {
		return id, true
	}
	vs, err := s.d.ListSessions(r.Context(), tenant, job.Metadata{metaContextOf: id, metaLanguage: name, metaDefault: "true"})
	if err != nil {
		s.writeDomainTextError(w, err)
		return "", false
	}
	vs = live(vs)
	if len(vs) > 0 {
		return vs[0].ID, true
	}
	v, err := s.newContext(r, tenant, id, name, runtime, true)
	if err != nil {
		s.writeDomainTextError(w, err)
		return "", false
	}
	return v.ID, true
}

// live is vs without the ended sessions, oldest first.
func live(vs []job.Session) []job.Session {
	out := vs[:0:0]
	for _, v := range vs {
		if v.Status != job.SessionEnded {
			out = append(out, v)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// newContext makes a context's session for sandbox id: its idle timeout
// the sandbox's.
func (s *Surface) newContext(r *http.Request, tenant, id, name, runtime string, isDefault bool) (job.Session, error) {
	sbx, _, err := s.d.GetSession(r.Context(), tenant, id)
	if err != nil {
		return job.Session{}, err
	}
	meta := job.Metadata{metaContextOf: id, metaLanguage: name}
	if isDefault {
		meta[metaDefault] = "true"
	}
	return s.d.CreateSession(r.Context(), tenant, job.SessionSpec{Runtime: runtime, IdleTimeoutS: sbx.IdleTimeoutS, Metadata: meta})
}

// context is context ctx of sandbox id, or answers that there is none.
func (s *Surface) context(w http.ResponseWriter, r *http.Request, tenant, id, ctx string) (job.Session, bool) {
	v, _, err := s.d.GetSession(r.Context(), tenant, ctx)
	if err != nil || v.Metadata[metaContextOf] != id || v.Status == job.SessionEnded {
		writeText(w, http.StatusNotFound, fmt.Sprintf("context %s not found in sandbox %s", ctx, id))
		return v, false
	}
	return v, true
}

// contextsOf are sandbox id's contexts beyond its own.
func (s *Surface) contextsOf(r *http.Request, tenant, id string) ([]job.Session, error) {
	vs, err := s.d.ListSessions(r.Context(), tenant, job.Metadata{metaContextOf: id})
	return live(vs), err
}

func (s *Surface) handleContexts(w http.ResponseWriter, r *http.Request, tenant, id string) {
	if _, ok := s.session(w, r, tenant, id, true); !ok {
		return
	}
	vs, err := s.contextsOf(r, tenant, id)
	if err != nil {
		s.writeDomainTextError(w, err)
		return
	}
	out := []codeContext{{ID: defaultContext, Language: "python", Cwd: homeDir}}
	for _, v := range vs {
		out = append(out, codeContext{ID: v.ID, Language: v.Metadata[metaLanguage], Cwd: homeDir})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleContextCreate answers POST /contexts {language, cwd}: a context of
// its own, in a sandbox of its own (its own /work).
func (s *Surface) handleContextCreate(w http.ResponseWriter, r *http.Request, tenant, id string) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil && err != io.EOF {
		writeText(w, http.StatusBadRequest, "the body is not a context to create: "+err.Error())
		return
	}
	name, runtime, err := languageOf(body.Language)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.Cwd != "" && body.Cwd != homeDir {
		writeText(w, http.StatusBadRequest, fmt.Sprintf("cwd %q: a Kiln context runs in %s", body.Cwd, homeDir))
		return
	}
	if _, ok := s.session(w, r, tenant, id, true); !ok {
		return
	}
	v, err := s.newContext(r, tenant, id, name, runtime, false)
	if err != nil {
		s.writeDomainTextError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, codeContext{ID: v.ID, Language: name, Cwd: homeDir})
}

// handleContextDelete answers DELETE /contexts/{ctx}: the context's session
// ends. The sandbox's own context ends with the sandbox only.
func (s *Surface) handleContextDelete(w http.ResponseWriter, r *http.Request, tenant, id string) {
	ctx := r.PathValue("ctx")
	if ctx == defaultContext {
		writeText(w, http.StatusBadRequest, "the sandbox's own context ("+defaultContext+") ends with the sandbox: kill the sandbox (docs/e2b.md)")
		return
	}
	if _, ok := s.context(w, r, tenant, id, ctx); !ok {
		return
	}
	if _, err := s.d.DeleteSession(r.Context(), tenant, ctx); err != nil {
		s.writeDomainTextError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// eachContext does fn to each of sandbox id's contexts (what the sandbox
// had done to it: killed, paused), logging what it could not do: a context
// left ends or pauses on its own idle timeout.
func (s *Surface) eachContext(r *http.Request, tenant, id, what string, fn func(ctx job.Session) error) {
	vs, err := s.contextsOf(r, tenant, id)
	if err != nil {
		s.log.WarnContext(r.Context(), "e2b: list a sandbox's contexts", slog.String("sandbox", id), slog.String("for", what), slog.Any("error", err))
		return
	}
	for _, v := range vs {
		if err := fn(v); err != nil {
			s.log.WarnContext(r.Context(), "e2b: a sandbox's context", slog.String("sandbox", id), slog.String("context", v.ID), slog.String("for", what), slog.Any("error", err))
		}
	}
}

func (s *Surface) handleContextRestart(w http.ResponseWriter, r *http.Request, _, _ string) {
	writeText(w, http.StatusNotImplemented, "restarting a context's interpreter is not served: remove the context and create another, or kill the sandbox (docs/e2b.md)")
}
