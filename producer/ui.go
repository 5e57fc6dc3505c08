package producer

import (
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// The run page: a read-only view of a job (/ui/jobs/{id}) or a session
// (/ui/sessions/{id}) as a person wants to see it: its code, its output
// (followed live while it runs, over the job's event stream), its display
// outputs rendered (images; HTML in a sandboxed frame that runs no script),
// the exception, the artifacts, the image digest and the trace. Pages are
// rendered here with html/template from the same records the JSON API
// answers from, with the same tenant scoping (another tenant's run is 404);
// the templates, the style sheet and the script are embedded (ui/).
//
// A browser sends the API key in a cookie (uiKeyCookie, set by the login
// form at /ui/login: HttpOnly, SameSite=Strict), or a client sends it in the
// Authorization header as on every route. The cookie authorizes reads only
// (authenticate), which is what the page's script does: the event stream
// and the artifacts.

//go:embed ui
var uiFiles embed.FS

// uiKeyCookie holds the API key of a browser that logged in at /ui/login.
const uiKeyCookie = "kiln_key"

// uiCSP keeps a page's own script the only one that runs: nothing inline,
// nothing from elsewhere; images only from here or data: URLs; frames only
// as srcdoc (a display output's HTML, sandboxed besides).
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// Bounds on what a page carries inline: the rest is a link to the JSON.
const (
	uiMaxStream = 1 << 20 // bytes of stdout or stderr shown
	uiMaxCalls  = 50      // a session's latest calls shown
)

var uiTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"bytes": func(n int64) string {
		switch {
		case n >= 1<<20:
			return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
		case n >= 1<<10:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%d B", n)
	},
}).ParseFS(uiFiles, "ui/*.html"))

// uiLogin is the login form's data.
type uiLogin struct {
	Next, Message string
}

// uiNext is where a login sends a person: a run page of this API, never
// another site.
func uiNext(next string) string {
	if strings.HasPrefix(next, "/ui/jobs/") || strings.HasPrefix(next, "/ui/sessions/") {
		if u, err := url.Parse(next); err == nil && u.Host == "" && u.Scheme == "" {
			return u.Path
		}
	}
	return "/ui/login"
}

// uiRoutes serve the run page: server-rendered HTML of a job's or a
// session's records for people, behind a login form that keeps the API key
// in a cookie.
type uiRoutes struct {
	keys     apiKeys
	cfg      *Config // TraceURL
	store    Store
	blobs    *blob.Store // specs sent by reference
	sessions *sessions
	results  *resultWriter
	problems *problems
	log      *slog.Logger
}

// uiAuthed is authed for a page: a caller without a valid key is shown the
// login form (401) rather than a problem document.
func (u *uiRoutes) uiAuthed(h func(w http.ResponseWriter, r *http.Request, caller string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(u.keys) == 0 {
			h(w, r, job.DefaultTenant)
			return
		}
		caller, _, p := u.keys.authenticate(r)
		if p != nil {
			u.renderUI(w, http.StatusUnauthorized, "login.html", uiLogin{Next: r.URL.Path, Message: "Log in with your API key to see this run."})
			return
		}
		h(w, r, caller)
	}
}

// renderUI answers status with the page tmpl made of data.
func (u *uiRoutes) renderUI(w http.ResponseWriter, status int, tmpl string, data any) {
	var b strings.Builder
	if err := uiTemplates.ExecuteTemplate(&b, tmpl, data); err != nil {
		u.log.Error("render run page", "template", tmpl, "error", err)
		writeProblem(w, newProblem(http.StatusInternalServerError, job.ProblemInternal, "Internal error", "the page could not be made"))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// uiNotFound is the page for a run that is not the caller's to see: never
// existed, expired, or another tenant's (the same answer for each).
func (u *uiRoutes) uiNotFound(w http.ResponseWriter, what, id string) {
	u.renderUI(w, http.StatusNotFound, "notfound.html", map[string]string{"What": what, "ID": id})
}

// handleUIAsset serves the page's style sheet and script.
func (u *uiRoutes) handleUIAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	types := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
	ct, ok := types[path.Ext(name)]
	b, err := fs.ReadFile(uiFiles, "ui/"+name)
	if !ok || err != nil {
		writeProblem(w, newProblem(http.StatusNotFound, job.ProblemNotFound, "No such asset", fmt.Sprintf("the run page has no asset %q", name)))
		return
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}

// handleUILogin shows the login form.
func (u *uiRoutes) handleUILogin(w http.ResponseWriter, r *http.Request) {
	u.renderUI(w, http.StatusOK, "login.html", uiLogin{Next: uiNext(r.URL.Query().Get("next"))})
}

// handleUILoginPost checks the key a person typed and, when it is one,
// keeps it in the page's cookie and sends them on (303) to next, a run
// page; else the form again (401).
func (u *uiRoutes) handleUILoginPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		u.renderUI(w, http.StatusBadRequest, "login.html", uiLogin{Message: "The form could not be read."})
		return
	}
	key, next := strings.TrimSpace(r.PostForm.Get("key")), uiNext(r.PostForm.Get("next"))
	if len(u.keys) > 0 {
		probe := &http.Request{Method: http.MethodGet, Header: http.Header{"Authorization": {"Bearer " + key}}}
		if _, _, p := u.keys.authenticate(probe); p != nil || key == "" {
			u.renderUI(w, http.StatusUnauthorized, "login.html", uiLogin{Next: next, Message: "That is not a valid API key."})
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: uiKeyCookie, Value: key, Path: "/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int((12 * time.Hour).Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}
