package e2bapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// The control plane: a sandbox is a session of the python runtime.

// metaTemplate is the metadata key the package keeps in a session's
// metadata: the template the sandbox was created from, which E2B's
// metadata does not show (nor the keys of a context's session:
// contexts.go). Its envVars are the session's env.
const metaTemplate = "e2b.template"

// templates E2B's SDKs create sandboxes from, and the runtime each is.
var templates = map[string]string{"code-interpreter-v1": "python", "code-interpreter": "python", "base": "python"}

// defaultTimeout is E2B's sandbox timeout when the request sets none.
const defaultTimeout = 300 * time.Second

// createBody is POST /sandboxes' and POST /v2/sandboxes' body (the fields
// Kiln reads; the others are accepted and not used: docs/e2b.md).
type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    int64             `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
}

// sandbox is E2B's answer to create and connect.
type sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is E2B's answer to GET /sandboxes/{id} and an item of the
// listings.
type sandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	MemoryMB        int64             `json:"memoryMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
}

const clientID = "kiln"

func (s *Surface) handleCreate(w http.ResponseWriter, r *http.Request, tenant string) {
	var body createBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "the body is not a sandbox to create: "+err.Error())
		return
	}
	tpl := body.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	runtime, ok := templates[tpl]
	if !ok {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("template %q is not served by Kiln: use code-interpreter-v1 or base (a python session); custom templates are Kiln images (docs/e2b.md)", tpl))
		return
	}
	timeout := time.Duration(body.Timeout) * time.Second
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	meta := job.Metadata{metaTemplate: tpl}
	for k, v := range body.Metadata {
		if strings.HasPrefix(k, "e2b.") {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata key %q is Kiln's own: keys starting e2b. keep a sandbox's template and its contexts", k))
			return
		}
		meta[k] = v
	}
	spec := job.SessionSpec{Runtime: runtime, IdleTimeoutS: int64(timeout / time.Second), Metadata: meta, Env: body.EnvVars}
	if life := job.SessionMaxLifetimeDefault; timeout > life {
		spec.MaxLifetimeS = int64(timeout / time.Second)
	}
	v, err := s.d.CreateSession(r.Context(), tenant, spec)
	if err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxOf(r, v))
}

func (s *Surface) sandboxOf(r *http.Request, v job.Session) sandbox {
	tok := s.d.SessionToken(r.Context(), v.ID)
	return sandbox{TemplateID: v.Metadata[metaTemplate], SandboxID: v.ID, ClientID: clientID, EnvdVersion: envdVersion,
		EnvdAccessToken: tok, TrafficAccessToken: tok}
}

// detailOf is session v as E2B shows a sandbox.
func (s *Surface) detailOf(v job.Session) sandboxDetail {
	end := v.ExpiresAt
	if v.Status != job.SessionPaused && !v.IdleExpiresAt.IsZero() && v.IdleExpiresAt.Before(end) {
		end = v.IdleExpiresAt
	}
	state := "running"
	if v.Status == job.SessionPaused {
		state = "paused"
	}
	return sandboxDetail{TemplateID: v.Metadata[metaTemplate], SandboxID: v.ID, ClientID: clientID, StartedAt: v.CreatedAt,
		EndAt: end, EnvdVersion: envdVersion, MemoryMB: v.MemoryMB, Metadata: userMetadata(v.Metadata), State: state}
}

// userMetadata is m without the keys the package keeps there.
func userMetadata(m job.Metadata) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if k != metaTemplate {
			out[k] = v
		}
	}
	return out
}

// session reads the caller's sandbox id, or answers why it cannot (ok
// false): a domain refusal, or a sandbox that ended, which is not found as
// E2B answers for a sandbox killed or timed out. text answers in plain
// text (the code interpreter's routes), else as E2B's error body.
func (s *Surface) session(w http.ResponseWriter, r *http.Request, tenant, id string, text bool) (job.Session, bool) {
	v, _, err := s.d.GetSession(r.Context(), tenant, id)
	status, msg := 0, ""
	switch {
	case err != nil && !text:
		s.writeDomainError(w, r, err)
		return v, false
	case err != nil:
		status, msg = domainStatus(err), err.Error()
	case v.Status == job.SessionEnded:
		status, msg = http.StatusNotFound, fmt.Sprintf("sandbox %s not found: it ended (%s)", id, v.EndedReason)
	case isContext(v):
		status, msg = http.StatusNotFound, fmt.Sprintf("sandbox %s not found: it is a code context of sandbox %s", id, v.Metadata[metaContextOf])
	default:
		return v, true
	}
	if text {
		writeText(w, status, msg)
	} else {
		writeError(w, status, msg)
	}
	return v, false
}

func (s *Surface) handleGet(w http.ResponseWriter, r *http.Request, tenant string) {
	v, ok := s.session(w, r, tenant, r.PathValue("id"), false)
	if !ok {
		return
	}
	d := s.detailOf(v)
	d.EnvdAccessToken = s.d.SessionToken(r.Context(), v.ID)
	writeJSON(w, http.StatusOK, d)
}

// handleList answers GET /v2/sandboxes: the caller's sandboxes whose
// metadata holds every pair of ?metadata (k=v&k2=v2, URL-encoded), in the
// states ?state lists (running,paused; both by default). Kiln holds at most
// a few sessions per key, so one page holds them all.
func (s *Surface) handleList(w http.ResponseWriter, r *http.Request, tenant string) {
	states := map[string]bool{"running": true, "paused": true}
	if q := r.URL.Query().Get("state"); q != "" {
		states = map[string]bool{}
		for _, st := range strings.Split(q, ",") {
			states[strings.TrimSpace(st)] = true
		}
	}
	s.list(w, r, tenant, states)
}

// handleListV1 answers GET /sandboxes: the running sandboxes.
func (s *Surface) handleListV1(w http.ResponseWriter, r *http.Request, tenant string) {
	s.list(w, r, tenant, map[string]bool{"running": true})
}

func (s *Surface) list(w http.ResponseWriter, r *http.Request, tenant string, states map[string]bool) {
	tags := job.Metadata{}
	if q := r.URL.Query().Get("metadata"); q != "" {
		pairs, err := url.ParseQuery(q)
		if err != nil {
			writeError(w, http.StatusBadRequest, "metadata is not a query string of key=value pairs: "+err.Error())
			return
		}
		for k, vs := range pairs {
			if len(vs) > 0 {
				tags[k] = vs[len(vs)-1]
			}
		}
	}
	if tpl := r.URL.Query().Get("template"); tpl != "" {
		tags[metaTemplate] = tpl
	}
	vs, err := s.d.ListSessions(r.Context(), tenant, tags)
	if err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	out := make([]sandboxDetail, 0, len(vs))
	for _, v := range vs {
		d := s.detailOf(v)
		if states[d.State] && !isContext(v) {
			out = append(out, d)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartedAt.After(out[j].StartedAt) })
	writeJSON(w, http.StatusOK, out)
}

func (s *Surface) handleKill(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if _, ok := s.session(w, r, tenant, id, false); !ok {
		return
	}
	if _, err := s.d.DeleteSession(r.Context(), tenant, id); err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	s.ctxs.each(r.Context(), tenant, id, "kill", func(ctx job.Session) error {
		_, err := s.d.DeleteSession(r.Context(), tenant, ctx.ID)
		return err
	})
	w.WriteHeader(http.StatusNoContent)
}

// handleTimeout answers POST /sandboxes/{id}/timeout. Kiln's session keeps
// the idle timeout it was created with (E2B's timeout at create) and
// restarts it on every call: a timeout within it is kept by restarting the
// clock now (an empty call); a longer one cannot be, and is refused.
func (s *Surface) handleTimeout(w http.ResponseWriter, r *http.Request, tenant string) {
	var body struct {
		Timeout int64 `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.Timeout < 0 {
		writeError(w, http.StatusBadRequest, "the body must be {\"timeout\": seconds}")
		return
	}
	id := r.PathValue("id")
	v, ok := s.session(w, r, tenant, id, false)
	if !ok {
		return
	}
	if body.Timeout > v.IdleTimeoutS {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("this sandbox's timeout is %d s, set when it was created: Kiln restarts it on every call but cannot lengthen it; create the sandbox with a timeout of at least %d s",
			v.IdleTimeoutS, body.Timeout))
		return
	}
	if _, _, err := s.d.RunCall(r.Context(), tenant, id, job.SessionCall{Code: "pass"}, s.d.MaxWait()); err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleConnect answers POST /sandboxes/{id}/connect (and /v2/..., and the
// older /resume): the sandbox, resumed when paused, with its access token.
func (s *Surface) handleConnect(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	v, ok := s.session(w, r, tenant, id, false)
	if !ok {
		return
	}
	code := http.StatusOK
	if v.Status == job.SessionPaused {
		var err error
		if v, err = s.d.ResumeSession(r.Context(), tenant, id); err != nil {
			s.writeDomainError(w, r, err)
			return
		}
		code = http.StatusCreated
	}
	writeJSON(w, code, s.sandboxOf(r, v))
}

// handlePause answers POST /sandboxes/{id}/pause: Kiln's pause (the
// session's /work kept, its box let go) once the calls before it end.
func (s *Surface) handlePause(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	v, ok := s.session(w, r, tenant, id, false)
	if !ok {
		return
	}
	if v.Status == job.SessionPaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", id))
		return
	}
	if _, _, err := s.d.PauseSession(r.Context(), tenant, id, s.d.MaxWait()); err != nil {
		s.writeDomainError(w, r, err)
		return
	}
	// Its contexts pause with it (a call resumes one, as it resumes any
	// session).
	s.ctxs.each(r.Context(), tenant, id, "pause", func(ctx job.Session) error {
		if ctx.Status == job.SessionPaused {
			return nil
		}
		_, _, err := s.d.PauseSession(r.Context(), tenant, ctx.ID, s.d.MaxWait())
		return err
	})
	w.WriteHeader(http.StatusNoContent)
}
