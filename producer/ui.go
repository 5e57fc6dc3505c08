package producer

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/cache"
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

// uiAuthed is authed for a page: a caller without a valid key is shown the
// login form (401) rather than a problem document.
func (s *Server) uiAuthed(h func(w http.ResponseWriter, r *http.Request, caller string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(s.keys) == 0 {
			h(w, r, job.DefaultTenant)
			return
		}
		caller, _, p := s.authenticate(r)
		if p != nil {
			s.renderUI(w, http.StatusUnauthorized, "login.html", uiLogin{Next: r.URL.Path, Message: "Log in with your API key to see this run."})
			return
		}
		h(w, r, caller)
	}
}

// renderUI answers status with the page tmpl made of data.
func (s *Server) renderUI(w http.ResponseWriter, status int, tmpl string, data any) {
	var b strings.Builder
	if err := uiTemplates.ExecuteTemplate(&b, tmpl, data); err != nil {
		s.log.Error("render run page", "template", tmpl, "error", err)
		writeProblem(w, newProblem(http.StatusInternalServerError, typeInternal, "Internal error", "the page could not be made"))
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
func (s *Server) uiNotFound(w http.ResponseWriter, what, id string) {
	s.renderUI(w, http.StatusNotFound, "notfound.html", map[string]string{"What": what, "ID": id})
}

// handleUIAsset serves the page's style sheet and script.
func (s *Server) handleUIAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	types := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
	ct, ok := types[path.Ext(name)]
	b, err := fs.ReadFile(uiFiles, "ui/"+name)
	if !ok || err != nil {
		writeProblem(w, newProblem(http.StatusNotFound, typeNotFound, "No such asset", fmt.Sprintf("the run page has no asset %q", name)))
		return
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}

// uiLogin is the login form's data.
type uiLogin struct {
	Next, Message string
}

// handleUILogin shows the login form.
func (s *Server) handleUILogin(w http.ResponseWriter, r *http.Request) {
	s.renderUI(w, http.StatusOK, "login.html", uiLogin{Next: uiNext(r.URL.Query().Get("next"))})
}

// handleUILoginPost checks the key a person typed and, when it is one,
// keeps it in the page's cookie and sends them on (303) to next, a run
// page; else the form again (401).
func (s *Server) handleUILoginPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		s.renderUI(w, http.StatusBadRequest, "login.html", uiLogin{Message: "The form could not be read."})
		return
	}
	key, next := strings.TrimSpace(r.PostForm.Get("key")), uiNext(r.PostForm.Get("next"))
	if len(s.keys) > 0 {
		probe := &http.Request{Method: http.MethodGet, Header: http.Header{"Authorization": {"Bearer " + key}}}
		if _, _, p := s.authenticate(probe); p != nil || key == "" {
			s.renderUI(w, http.StatusUnauthorized, "login.html", uiLogin{Next: next, Message: "That is not a valid API key."})
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: uiKeyCookie, Value: key, Path: "/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int((12 * time.Hour).Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
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

// uiRun is what a page shows of one run: a job, or a session's call.
type uiRun struct {
	ID, Title  string
	Status     string
	Terminal   bool
	Live       string // the events URL to follow while the run goes on
	Runtime    string
	Code       string
	CodeNote   string
	Stdout     string
	Stderr     string
	StreamNote string
	ExitCode   string
	Error      *job.Failure
	Outputs    []uiOutput
	OutputNote string
	Artifacts  []uiArtifact
	Facts      []uiFact
}

type uiFact struct {
	Name, Value string
	Link        string
}

type uiArtifact struct {
	Name, URL, Type string
	Size            int64
}

// uiOutput is one display output as the page shows it.
type uiOutput struct {
	N     int
	Types string
	Text  string       // text/plain, shown unless the output is an image
	Image template.URL // a data: URL of an image carried inline
	Src   string       // an image stored as an artifact
	HTML  string       // text/html, shown in a sandboxed frame (srcdoc)
	JSON  string       // application/json, pretty
	Link  string       // a stored value the page does not show inline
}

// uiImageTypes are the image types a page shows inline (as data: URLs in
// img elements, where an SVG runs no script either).
var uiImageTypes = map[string]bool{job.MIMEPNG: true, job.MIMEJPEG: true, "image/gif": true, "image/webp": true, job.MIMESVG: true}

func (s *Server) uiOutputs(jobID string, outs []job.Output, artifactBase string) []uiOutput {
	var list []uiOutput
	for i, o := range outs {
		u := uiOutput{N: i + 1}
		var types []string
		for m := range o.Data {
			types = append(types, m)
		}
		for m := range o.Artifacts {
			types = append(types, m)
		}
		sort.Strings(types)
		u.Types = strings.Join(types, ", ")
		image := false
		for _, m := range types {
			if !uiImageTypes[m] {
				continue
			}
			image = true
			if raw, ok := o.Data[m]; ok {
				var v string
				if json.Unmarshal(raw, &v) == nil {
					if m == job.MIMESVG {
						v = base64.StdEncoding.EncodeToString([]byte(v))
					}
					if _, err := base64.StdEncoding.DecodeString(v); err == nil {
						// Checked base64 of an image type: nothing else can
						// ride in the URL.
						u.Image = template.URL("data:" + m + ";base64," + v)
					}
				}
			} else if name := o.Artifacts[m]; name != "" && artifactBase != "" {
				u.Src = artifactBase + uiPathEscape(name)
			}
			break
		}
		if !image {
			u.Text = o.Text(job.MIMEText)
		}
		if html := o.Text(job.MIMEHTML); html != "" {
			u.HTML = html
		} else if name := o.Artifacts[job.MIMEHTML]; name != "" && artifactBase != "" {
			u.Link = artifactBase + uiPathEscape(name)
		}
		if raw, ok := o.Data[job.MIMEJSON]; ok {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				b, _ := json.MarshalIndent(v, "", "  ")
				u.JSON = string(b)
			}
		}
		list = append(list, u)
	}
	return list
}

func uiPathEscape(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// clipStream is at most uiMaxStream bytes of a stream, and whether it was cut.
func clipStream(s string) (string, bool) {
	if len(s) <= uiMaxStream {
		return s, false
	}
	return strings.ToValidUTF8(s[:uiMaxStream], ""), true
}

func uiTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// traceLink is the trace's URL from Config.TraceURL, or "".
func (s *Server) traceLink(traceID string) string {
	if s.cfg.TraceURL == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(s.cfg.TraceURL, "{trace_id}", url.PathEscape(traceID))
}

// uiResultFacts are a finished run's facts the page lists.
func (s *Server) uiResultFacts(r *job.Result) []uiFact {
	var f []uiFact
	add := func(name, value, link string) {
		if value != "" {
			f = append(f, uiFact{Name: name, Value: value, Link: link})
		}
	}
	add("image", r.Image.Name, "")
	add("image digest", r.Image.Digest, "")
	add("trace", r.TraceID, s.traceLink(r.TraceID))
	if r.Status.Terminal() {
		add("wall time", fmt.Sprintf("%d ms", r.WallMS), "")
		add("CPU time", fmt.Sprintf("%d ms", r.CPUMS), "")
		if r.MemoryPeakBytes > 0 {
			add("peak memory", fmt.Sprintf("%.1f MiB", float64(r.MemoryPeakBytes)/(1<<20)), "")
		}
	}
	if r.CacheHit {
		add("cache", "hit: answered from an identical earlier run", "")
	}
	add("created", uiTime(r.CreatedAt), "")
	add("started", uiTime(r.StartedAt), "")
	add("finished", uiTime(r.FinishedAt), "")
	if r.Attempt > 0 {
		add("attempt", strconv.Itoa(r.Attempt), "")
	}
	add("worker", r.Worker, "")
	if r.ReplayOf != "" {
		add("replay of", r.ReplayOf, "/ui/jobs/"+r.ReplayOf)
	}
	return f
}

// handleUIJob renders a job's page.
func (s *Server) handleUIJob(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		s.uiNotFound(w, "job", id)
		return
	}
	rec, err := s.tenantJob(ctx, caller, id)
	if errors.Is(err, cache.ErrNotFound) {
		s.uiNotFound(w, "job", id)
		return
	}
	if err != nil {
		writeProblem(w, s.storeProblem(ctx, "get job", err))
		return
	}
	run, p := s.uiJobRun(ctx, &rec)
	if p != nil {
		writeProblem(w, p)
		return
	}
	s.renderUI(w, http.StatusOK, "job.html", run)
}

// uiJobRun is rec as the page shows it.
func (s *Server) uiJobRun(ctx context.Context, rec *cache.Record) (uiRun, *problem) {
	m := rec.Message
	run := uiRun{ID: m.ID, Title: "Job " + m.ID, Status: string(rec.Status), Terminal: rec.Status.Terminal(), Runtime: m.Spec.Runtime}
	spec := m.Spec
	switch {
	case rec.CacheHit:
		run.CodeNote = "A cache hit keeps no code of its own: its result is an identical earlier run's."
	case m.SpecRef != nil:
		if b, err := s.blobs.GetBytes(ctx, *m.SpecRef, job.MaxSpecJSONSize); err == nil {
			_ = json.Unmarshal(b, &spec)
		} else {
			run.CodeNote = "The job's code was sent by reference and is no longer kept."
		}
	}
	run.Code = spec.Code
	var facts []uiFact
	facts = append(facts, uiFact{Name: "runtime", Value: spec.Runtime})
	for _, k := range sortedKeys(m.Spec.Metadata) {
		facts = append(facts, uiFact{Name: "metadata " + k, Value: m.Spec.Metadata[k]})
	}
	if !run.Terminal {
		run.Live = "/v1/jobs/" + m.ID + "/events"
		facts = append(facts, uiFact{Name: "created", Value: m.CreatedAt.UTC().Format(time.RFC3339Nano)})
		facts = append(facts, uiFact{Name: "trace", Value: m.TraceID, Link: s.traceLink(m.TraceID)})
		run.Facts = facts
		return run, nil
	}
	view, _ := recordView(rec)
	rv := view.(*resultView)
	res := rv.Result
	if err := s.loadOutput(ctx, &res); err != nil {
		return run, s.outputProblem(ctx, m.ID, err)
	}
	run.Facts = append(facts, s.uiResultFacts(&res)...)
	if res.ExitCode != nil {
		run.ExitCode = strconv.Itoa(*res.ExitCode)
	}
	run.Error = res.Error
	var cut1, cut2 bool
	run.Stdout, cut1 = clipStream(res.Stdout)
	run.Stderr, cut2 = clipStream(res.Stderr)
	if cut1 || cut2 || res.StdoutTruncated || res.StderrTruncated {
		run.StreamNote = fmt.Sprintf("Output shortened (%d stdout bytes, %d stderr bytes in all): the whole of what was kept is in the JSON.", res.StdoutBytes, res.StderrBytes)
	}
	base := "/v1/jobs/" + m.ID + "/artifacts/"
	run.Outputs = s.uiOutputs(m.ID, res.Outputs, base)
	if res.OutputsTruncated {
		run.OutputNote = fmt.Sprintf("%d display outputs were not kept (too many or too large).", res.OutputsDropped)
	}
	for _, a := range res.Artifacts {
		run.Artifacts = append(run.Artifacts, uiArtifact{Name: a.Name, URL: base + uiPathEscape(a.Name), Type: a.ContentType, Size: a.Size})
	}
	return run, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// uiSession is a session's page.
type uiSession struct {
	ID, Status string
	Facts      []uiFact
	Calls      []uiRun
	Note       string
}

// handleUISession renders a session's page: the session, then its latest
// calls, newest last.
func (s *Server) handleUISession(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	st, p := s.sessionStore()
	if p != nil {
		writeProblem(w, p)
		return
	}
	id := r.PathValue("id")
	rec, p := s.sessionOf(ctx, st, caller, id)
	if p != nil {
		if p.Status == http.StatusNotFound {
			s.uiNotFound(w, "session", id)
		} else {
			writeProblem(w, p)
		}
		return
	}
	v := rec.View(time.Now())
	page := uiSession{ID: v.ID, Status: v.Status}
	page.Facts = []uiFact{{Name: "runtime", Value: v.Runtime}, {Name: "image", Value: v.Image.Name}, {Name: "image digest", Value: v.Image.Digest},
		{Name: "created", Value: v.CreatedAt.Format(time.RFC3339)}, {Name: "expires", Value: v.ExpiresAt.Format(time.RFC3339)},
		{Name: "incarnation", Value: strconv.Itoa(v.Incarnation)}, {Name: "calls", Value: strconv.FormatInt(v.Calls, 10)}}
	if v.EndedReason != "" {
		page.Facts = append(page.Facts, uiFact{Name: "ended", Value: v.EndedReason})
	}
	for _, k := range sortedKeys(v.Metadata) {
		page.Facts = append(page.Facts, uiFact{Name: "metadata " + k, Value: v.Metadata[k]})
	}
	first := max(int64(1), rec.Seq-uiMaxCalls+1)
	if first > 1 {
		page.Note = fmt.Sprintf("The %d calls before call %d are not shown: GET /v1/sessions/%s/calls/{seq} reads them.", first-1, first, v.ID)
	}
	for seq := first; seq <= rec.Seq; seq++ {
		c, err := st.SessionCall(ctx, rec.ID, seq)
		if errors.Is(err, cache.ErrNotFound) {
			continue
		}
		if err != nil {
			writeProblem(w, s.storeProblem(ctx, "read call", err))
			return
		}
		page.Calls = append(page.Calls, s.uiCallRun(ctx, v.ID, v.Runtime, seq, c))
	}
	s.renderUI(w, http.StatusOK, "session.html", page)
}

// uiCallRun is a session's call as the page shows it.
func (s *Server) uiCallRun(ctx context.Context, sessionID, runtime string, seq int64, c cache.SessionCallRecord) uiRun {
	run := uiRun{ID: strconv.FormatInt(seq, 10), Title: fmt.Sprintf("Call %d", seq), Runtime: runtime, Code: c.Spec.Code}
	if c.Result == nil {
		run.Status = cmpString(c.State, job.CallQueued)
		run.Live = fmt.Sprintf("/v1/sessions/%s/calls/%d/events", sessionID, seq)
		return run
	}
	res := c.Result.Result
	if err := s.loadOutput(ctx, &res); err != nil {
		run.StreamNote = "The call's long output is no longer kept."
	}
	run.Status, run.Terminal = string(res.Status), true
	if res.ExitCode != nil {
		run.ExitCode = strconv.Itoa(*res.ExitCode)
	}
	run.Error = res.Error
	run.Stdout, _ = clipStream(res.Stdout)
	run.Stderr, _ = clipStream(res.Stderr)
	run.Outputs = s.uiOutputs(res.ID, res.Outputs, "")
	run.Facts = []uiFact{{Name: "incarnation", Value: strconv.Itoa(c.Result.Incarnation)},
		{Name: "state restored", Value: strconv.FormatBool(c.Result.StateRestored)}}
	if c.Result.SessionNote != "" {
		run.Facts = append(run.Facts, uiFact{Name: "note", Value: c.Result.SessionNote})
	}
	run.Facts = append(run.Facts, s.uiResultFacts(&res)...)
	return run
}

func cmpString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
