package e2bapi

import (
	"context"
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
// listed or reached as a sandbox, it ends and pauses with its sandbox, and
// its id is the context's. A context runs in a sandbox of its own: it has
// its own /work, not the sandbox's (docs/e2b.md).

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

// codeContext is E2B's code context.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// contextError is a request about contexts that cannot be served: its
// status and why.
type contextError struct {
	status int
	msg    string
}

func (e *contextError) Error() string { return e.msg }

// languageOf is E2B language l as a context's language and runtime.
func languageOf(l string) (name, runtime string, err error) {
	lang, ok := languages[strings.ToLower(strings.TrimSpace(l))]
	if !ok {
		return "", "", &contextError{http.StatusBadRequest, fmt.Sprintf("language %q is not served by Kiln: python or javascript (docs/e2b.md)", l)}
	}
	return lang.name, lang.runtime, nil
}

// isContext reports whether session v is a context's rather than a sandbox.
func isContext(v job.Session) bool { return v.Metadata[metaContextOf] != "" }

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

// contexts are the sandboxes' code contexts, over the domain's sessions.
type contexts struct {
	d   Domain
	log *slog.Logger
}

// target is the session a call of sandbox sbx runs in: context ctxID's, or
// for none, language's default (the sandbox's own session for python; a
// javascript context made on first use).
func (c contexts) target(ctx context.Context, tenant string, sbx job.Session, ctxID, language string) (string, error) {
	id := sbx.ID
	if ctxID != "" && language != "" {
		return "", &contextError{http.StatusBadRequest, "give a context or a language, not both"}
	}
	if ctxID == defaultContext {
		return id, nil
	}
	if ctxID != "" {
		v, err := c.get(ctx, tenant, id, ctxID)
		return v.ID, err
	}
	name, runtime, err := languageOf(language)
	if err != nil || runtime == "python" {
		return id, err
	}
	vs, err := c.d.ListSessions(ctx, tenant, job.Metadata{metaContextOf: id, metaLanguage: name, metaDefault: "true"})
	if err != nil {
		return "", err
	}
	if vs = live(vs); len(vs) > 0 {
		return vs[0].ID, nil
	}
	v, err := c.create(ctx, tenant, sbx, name, runtime, true)
	return v.ID, err
}

// create makes a context's session for sandbox sbx, with its idle timeout.
func (c contexts) create(ctx context.Context, tenant string, sbx job.Session, name, runtime string, isDefault bool) (job.Session, error) {
	meta := job.Metadata{metaContextOf: sbx.ID, metaLanguage: name}
	if isDefault {
		meta[metaDefault] = "true"
	}
	return c.d.CreateSession(ctx, tenant, job.SessionSpec{Runtime: runtime, IdleTimeoutS: sbx.IdleTimeoutS, Metadata: meta})
}

// get is context ctxID of sandbox id.
func (c contexts) get(ctx context.Context, tenant, id, ctxID string) (job.Session, error) {
	v, _, err := c.d.GetSession(ctx, tenant, ctxID)
	if err != nil || v.Metadata[metaContextOf] != id || v.Status == job.SessionEnded {
		return v, &contextError{http.StatusNotFound, fmt.Sprintf("context %s not found in sandbox %s", ctxID, id)}
	}
	return v, nil
}

// of are sandbox id's contexts beyond its own.
func (c contexts) of(ctx context.Context, tenant, id string) ([]job.Session, error) {
	vs, err := c.d.ListSessions(ctx, tenant, job.Metadata{metaContextOf: id})
	return live(vs), err
}

// each does fn to each of sandbox id's contexts (what the sandbox had done
// to it: killed, paused), logging what it could not do: a context left
// ends or pauses on its own idle timeout.
func (c contexts) each(ctx context.Context, tenant, id, what string, fn func(v job.Session) error) {
	vs, err := c.of(ctx, tenant, id)
	if err != nil {
		c.log.WarnContext(ctx, "e2b: list a sandbox's contexts", slog.String("sandbox", id), slog.String("for", what), slog.Any("error", err))
		return
	}
	for _, v := range vs {
		if err := fn(v); err != nil {
			c.log.WarnContext(ctx, "e2b: a sandbox's context", slog.String("sandbox", id), slog.String("context", v.ID), slog.String("for", what), slog.Any("error", err))
		}
	}
}

func (s *Surface) handleContexts(w http.ResponseWriter, r *http.Request, tenant, id string) {
	if _, ok := s.session(w, r, tenant, id, true); !ok {
		return
	}
	vs, err := s.ctxs.of(r.Context(), tenant, id)
	if err != nil {
		writeDomainTextError(w, err)
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
	if err == nil && body.Cwd != "" && body.Cwd != homeDir {
		err = &contextError{http.StatusBadRequest, fmt.Sprintf("cwd %q: a Kiln context runs in %s", body.Cwd, homeDir)}
	}
	if err != nil {
		writeDomainTextError(w, err)
		return
	}
	sbx, ok := s.session(w, r, tenant, id, true)
	if !ok {
		return
	}
	v, err := s.ctxs.create(r.Context(), tenant, sbx, name, runtime, false)
	if err != nil {
		writeDomainTextError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, codeContext{ID: v.ID, Language: name, Cwd: homeDir})
}

// handleContextDelete answers DELETE /contexts/{ctx}: the context's session
// ends. The sandbox's own context ends with the sandbox only.
func (s *Surface) handleContextDelete(w http.ResponseWriter, r *http.Request, tenant, id string) {
	ctxID := r.PathValue("ctx")
	if ctxID == defaultContext {
		writeText(w, http.StatusBadRequest, "the sandbox's own context ("+defaultContext+") ends with the sandbox: kill the sandbox (docs/e2b.md)")
		return
	}
	if _, err := s.ctxs.get(r.Context(), tenant, id, ctxID); err != nil {
		writeDomainTextError(w, err)
		return
	}
	if _, err := s.d.DeleteSession(r.Context(), tenant, ctxID); err != nil {
		writeDomainTextError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// restartCode is the call that ends a context's interpreter, by the
// context's language: the session's next call starts a fresh one, in the
// same /work.
var restartCode = map[string]string{"python": `__import__("os")._exit(0)`, "javascript": "process.reallyExit(0)"}

// handleContextRestart answers POST /contexts/{ctx}/restart: the context's
// interpreter ends (a call of its session, after those before it), and its
// next call starts a fresh one; its files stay.
func (s *Surface) handleContextRestart(w http.ResponseWriter, r *http.Request, tenant, id string) {
	ctxID := r.PathValue("ctx")
	target, lang := id, "python"
	if ctxID != defaultContext {
		v, err := s.ctxs.get(r.Context(), tenant, id, ctxID)
		if err != nil {
			writeDomainTextError(w, err)
			return
		}
		target, lang = v.ID, v.Metadata[metaLanguage]
	} else if _, ok := s.session(w, r, tenant, id, true); !ok {
		return
	}
	if _, _, err := s.d.RunCall(r.Context(), tenant, target, job.SessionCall{Code: restartCode[lang]}, s.d.MaxWait()); err != nil {
		writeDomainTextError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
