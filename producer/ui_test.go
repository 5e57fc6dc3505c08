package producer

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// The run page: a finished job's code, output, display outputs (an image
// inline, HTML only inside a sandboxed frame, escaped into its srcdoc) and
// exception; another tenant's job is 404; the login form keeps the key in a
// cookie that authorizes reads only.
func TestRunPage(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-alice": "alice", "k-bob": "bob"}
		c.TraceURL = "http://jaeger.test/trace/{trace_id}"
	})
	ctx := context.Background()
	alice := []string{"Authorization", "Bearer k-alice"}
	id := accepted(t, b.submit(t, `{"code":"print('hi <b>')\nraise ValueError('bad')","cache":false,"metadata":{"team":"a"}}`, alice...)).ID
	html := `<p id="x">table</p><script>parent.document.title = "owned"</script>`
	if _, err := b.worker(t, ctx, func(job.Message) job.Result {
		r := job.Result{Status: job.StatusFailed, ExitCode: job.IntPtr(1), Image: job.Image{Name: "kiln.local/python:latest", Digest: testDigest},
			Error: &job.Failure{Category: job.CategoryRuntimeError, Message: "ValueError: bad",
				Exception: &job.Exception{Type: "ValueError", Message: "bad", Line: 2, SourceLine: "raise ValueError('bad')"}}}
		r.SetOutput([]byte("hi <b>\n"), []byte("Traceback ...\n"))
		png, _ := json.Marshal("iVBORw0KGgo=")
		h, _ := json.Marshal(html)
		txt, _ := json.Marshal("a figure")
		r.Outputs = []job.Output{
			{Type: job.OutputDisplay, Data: map[string]json.RawMessage{job.MIMEText: txt, job.MIMEPNG: png}},
			{Type: job.OutputResult, Data: map[string]json.RawMessage{job.MIMEText: txt, job.MIMEHTML: h}},
		}
		return r
	}); err != nil {
		t.Fatal(err)
	}
	page := b.do(t, http.MethodGet, "/ui/jobs/"+id, "", alice...)
	if page.StatusCode != http.StatusOK || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/jobs/%s: %d %s", id, page.StatusCode, page.body)
	}
	if csp := page.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("CSP %q", csp)
	}
	body := string(page.body)
	for _, want := range []string{
		"print(&#39;hi &lt;b&gt;&#39;)", // the code, escaped
		`hi &lt;b&gt;`,                  // stdout, escaped
		`data-role="exception-type">ValueError`, "line <span data-role=\"exception-line\">2</span>",
		`src="data:image/png;base64,iVBORw0KGgo="`, // the image inline
		`sandbox="" referrerpolicy="no-referrer" srcdoc="&lt;p id=&#34;x&#34;&gt;table&lt;/p&gt;&lt;script&gt;`,
		testDigest, `href="http://jaeger.test/trace/`, "team",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(body, "<script>parent") {
		t.Error("the output's script is in the page itself, not inside the sandboxed frame's escaped srcdoc")
	}

	// Another tenant's job is not found; no key is the login form.
	if r := b.do(t, http.MethodGet, "/ui/jobs/"+id, "", "Authorization", "Bearer k-bob"); r.StatusCode != http.StatusNotFound {
		t.Errorf("bob reads alice's page: %d", r.StatusCode)
	}
	if r := b.do(t, http.MethodGet, "/ui/jobs/"+id, "", "Authorization", ""); r.StatusCode != http.StatusUnauthorized || !strings.Contains(string(r.body), `action="/ui/login"`) {
		t.Errorf("no key: %d %s", r.StatusCode, r.body)
	}

	// Log in: the key goes into a cookie, which reads pages and the JSON
	// API and changes nothing.
	postForm := func(form url.Values) *http.Response {
		t.Helper()
		noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := noFollow.PostForm(b.http.URL+"/ui/login", form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	login := postForm(url.Values{"key": {"k-alice"}, "next": {"/ui/jobs/" + id}})
	var cookie *http.Cookie
	for _, c := range login.Cookies() {
		if c.Name == uiKeyCookie {
			cookie = c
		}
	}
	if login.StatusCode != http.StatusSeeOther || login.Header.Get("Location") != "/ui/jobs/"+id || cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("login: %d %v %+v", login.StatusCode, login.Header, cookie)
	}
	withCookie := []string{"Authorization", "", "Cookie", uiKeyCookie + "=" + cookie.Value}
	for _, path := range []string{"/ui/jobs/" + id, "/v1/jobs/" + id} {
		if r := b.do(t, http.MethodGet, path, "", withCookie...); r.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the cookie: %d", path, r.StatusCode)
		}
	}
	if r := b.do(t, http.MethodPost, "/v1/jobs", `{"code":"print(1)"}`, withCookie...); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("a submission with only the cookie: %d, want 401", r.StatusCode)
	}
	if r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", withCookie...); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("a cancel with only the cookie: %d, want 401", r.StatusCode)
	}
	if bad := postForm(url.Values{"key": {"nope"}, "next": {"/ui/jobs/" + id}}); bad.StatusCode != http.StatusUnauthorized || len(bad.Cookies()) != 0 {
		t.Errorf("a wrong key: %d %v", bad.StatusCode, bad.Cookies())
	}
	for _, next := range []string{"https://evil.test/", "//evil.test/ui/jobs/x", "/v1/jobs"} {
		if r := postForm(url.Values{"key": {"k-alice"}, "next": {next}}); r.Header.Get("Location") != "/ui/login" {
			t.Errorf("login with next %q sends to %q", next, r.Header.Get("Location"))
		}
	}
	for _, asset := range []string{"run.js", "kiln.css"} {
		if r := b.do(t, http.MethodGet, "/ui/assets/"+asset, ""); r.StatusCode != http.StatusOK || len(r.body) == 0 {
			t.Errorf("asset %s: %d", asset, r.StatusCode)
		}
	}
	if r := b.do(t, http.MethodGet, "/ui/assets/layout.html", ""); r.StatusCode != http.StatusNotFound {
		t.Errorf("a template served as an asset: %d", r.StatusCode)
	}
}

// A display output whose JSON was flattened for its depth is shown as its
// JSON text, with a note, not laid out as a quoted string.
func TestRunPageShowsAFlattenedJSONAsItsText(t *testing.T) {
	deep := strings.Repeat("[", 150) + strings.Repeat("]", 150)
	flat, _ := json.Marshal(deep)
	outs := uiOutputs("j", []job.Output{{Type: job.OutputDisplay, Data: map[string]json.RawMessage{
		job.MIMEText: json.RawMessage(`"deep"`), job.MIMEJSON: flat}, Flattened: []string{job.MIMEJSON}}}, "")
	if len(outs) != 1 || outs[0].JSON != deep || !strings.Contains(outs[0].JSONNote, "deeper than 100 levels") {
		t.Fatalf("the output: JSON %.40q, note %q", outs[0].JSON, outs[0].JSONNote)
	}
}
