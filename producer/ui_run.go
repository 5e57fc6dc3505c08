package producer

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// What a run page shows: a job or a session's calls made into uiRun values
// from the records the JSON API answers from (ui.go serves them).

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
	// JSONNote says JSON is a flattened value's text (job.Output.Flattened).
	JSONNote string
	Link     string // a stored value the page does not show inline
}

// uiImageTypes are the image types a page shows inline (as data: URLs in
// img elements, where an SVG runs no script either).
var uiImageTypes = map[string]bool{job.MIMEPNG: true, job.MIMEJPEG: true, "image/gif": true, "image/webp": true, job.MIMESVG: true}

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

func cmpString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func uiOutputs(jobID string, outs []job.Output, artifactBase string) []uiOutput {
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
		if slices.Contains(o.Flattened, job.MIMEJSON) {
			// Nested too deep to carry as a structure: its JSON text,
			// shown as it is (laid out, it would be a line per level).
			u.JSON = o.Text(job.MIMEJSON)
			u.JSONNote = fmt.Sprintf("application/json nested deeper than %d levels: shown as its JSON text", job.MaxOutputJSONDepth)
		} else if raw, ok := o.Data[job.MIMEJSON]; ok {
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

// traceLink is the trace's URL from Config.TraceURL, or "".
func (u *uiRoutes) traceLink(traceID string) string {
	if u.cfg.TraceURL == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(u.cfg.TraceURL, "{trace_id}", url.PathEscape(traceID))
}

// uiResultFacts are a finished run's facts the page lists.
func (u *uiRoutes) uiResultFacts(r *job.Result) []uiFact {
	var f []uiFact
	add := func(name, value, link string) {
		if value != "" {
			f = append(f, uiFact{Name: name, Value: value, Link: link})
		}
	}
	add("image", r.Image.Name, "")
	add("image digest", r.Image.Digest, "")
	add("trace", r.TraceID, u.traceLink(r.TraceID))
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
func (u *uiRoutes) handleUIJob(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !job.ValidID(id) {
		u.uiNotFound(w, "job", id)
		return
	}
	rec, err := tenantJob(ctx, u.store, caller, id)
	if errors.Is(err, cache.ErrNotFound) {
		u.uiNotFound(w, "job", id)
		return
	}
	if err != nil {
		writeProblem(w, u.problems.storeProblem(ctx, "get job", err))
		return
	}
	run, p := u.uiJobRun(ctx, &rec)
	if p != nil {
		writeProblem(w, p)
		return
	}
	u.renderUI(w, http.StatusOK, "job.html", run)
}

// uiJobRun is rec as the page shows it.
func (u *uiRoutes) uiJobRun(ctx context.Context, rec *cache.Record) (uiRun, *problem) {
	m := rec.Message
	run := uiRun{ID: m.ID, Title: "Job " + m.ID, Status: string(rec.Status), Terminal: rec.Status.Terminal(), Runtime: m.Spec.Runtime}
	spec := m.Spec
	switch {
	case rec.CacheHit:
		run.CodeNote = "A cache hit keeps no code of its own: its result is an identical earlier run's."
	case m.SpecRef != nil:
		if b, err := u.blobs.GetBytes(ctx, *m.SpecRef, job.MaxSpecJSONSize); err == nil {
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
		facts = append(facts, uiFact{Name: "trace", Value: m.TraceID, Link: u.traceLink(m.TraceID)})
		run.Facts = facts
		return run, nil
	}
	view, _ := recordView(rec)
	rv := view.(*resultView)
	res := rv.Result
	if err := u.results.loadOutput(ctx, &res); err != nil {
		return run, u.results.outputProblem(ctx, m.ID, err)
	}
	run.Facts = append(facts, u.uiResultFacts(&res)...)
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
	run.Outputs = uiOutputs(m.ID, res.Outputs, base)
	if res.OutputsTruncated {
		run.OutputNote = fmt.Sprintf("%d display outputs were not kept (too many or too large).", res.OutputsDropped)
	}
	for _, a := range res.Artifacts {
		run.Artifacts = append(run.Artifacts, uiArtifact{Name: a.Name, URL: base + uiPathEscape(a.Name), Type: a.ContentType, Size: a.Size})
	}
	return run, nil
}

// handleUISession renders a session's page: the session, then its latest
// calls, newest last.
func (u *uiRoutes) handleUISession(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	st, p := u.sessions.sessionStore()
	if p != nil {
		writeProblem(w, p)
		return
	}
	id := r.PathValue("id")
	rec, p := u.sessions.sessionOf(ctx, st, caller, id)
	if p != nil {
		if p.Status == http.StatusNotFound {
			u.uiNotFound(w, "session", id)
		} else {
			writeProblem(w, p)
		}
		return
	}
	v := rec.View(u.cfg.Now())
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
			writeProblem(w, u.problems.storeProblem(ctx, "read call", err))
			return
		}
		page.Calls = append(page.Calls, u.uiCallRun(ctx, v.ID, v.Runtime, seq, c))
	}
	u.renderUI(w, http.StatusOK, "session.html", page)
}

// uiCallRun is a session's call as the page shows it.
func (u *uiRoutes) uiCallRun(ctx context.Context, sessionID, runtime string, seq int64, c cache.SessionCallRecord) uiRun {
	run := uiRun{ID: strconv.FormatInt(seq, 10), Title: fmt.Sprintf("Call %d", seq), Runtime: runtime, Code: c.Spec.Code}
	if d := cmp.Or(c.Spec.Command.Describe(), c.Spec.File.Describe()); d != "" {
		run.Code = d // a command or a file operation: no code of the client's
	}
	if c.Result == nil {
		run.Status = cmpString(c.State, job.CallQueued)
		run.Live = fmt.Sprintf("/v1/sessions/%s/calls/%d/events", sessionID, seq)
		return run
	}
	res := c.Result.Result
	if err := u.results.loadOutput(ctx, &res); err != nil {
		run.StreamNote = "The call's long output is no longer kept."
	}
	run.Status, run.Terminal = string(res.Status), true
	if res.ExitCode != nil {
		run.ExitCode = strconv.Itoa(*res.ExitCode)
	}
	run.Error = res.Error
	run.Stdout, _ = clipStream(res.Stdout)
	run.Stderr, _ = clipStream(res.Stderr)
	run.Outputs = uiOutputs(res.ID, res.Outputs, "")
	run.Facts = []uiFact{{Name: "incarnation", Value: strconv.Itoa(c.Result.Incarnation)},
		{Name: "state restored", Value: strconv.FormatBool(c.Result.StateRestored)}}
	if c.Result.SessionNote != "" {
		run.Facts = append(run.Facts, uiFact{Name: "note", Value: c.Result.SessionNote})
	}
	run.Facts = append(run.Facts, u.uiResultFacts(&res)...)
	return run
}
