package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Every answer any e2e suite gets from the API, 2xx and 202 included, is
// validated against producer/openapi.json: the suites' API servers are
// made with serveAPI, whose handler checks each answer as it leaves
// (checkedAPI). A body that disagrees fails the test that caused it.

// openAPIDoc is producer/openapi.json, read once.
var openAPIDoc = sync.OnceValues(func() ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", "producer", "openapi.json"))
})

// serveAPI serves h (an API handler) over httptest with every answer
// validated against the document.
func serveAPI(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	ca := &checkedAPI{report: func(err error) { t.Error(err) }, next: h}
	hs := httptest.NewUnstartedServer(ca)
	ca.v = specValidatorFor(t, "http://"+hs.Listener.Addr().String())
	hs.Start()
	t.Cleanup(hs.Close) // before the test ends: a late answer may still fail it
	return hs
}

// checkedHandler is h with every answer validated against the document,
// for an API served at base by the caller.
func checkedHandler(t *testing.T, h http.Handler, base string) http.Handler {
	t.Helper()
	return &checkedAPI{report: func(err error) { t.Error(err) }, v: specValidatorFor(t, base), next: h}
}

func specValidatorFor(t *testing.T, base string) *specValidator {
	t.Helper()
	raw, err := openAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	v, err := newSpecValidator(raw, base)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkedAPI passes requests to next and validates every answer: its
// status, headers and body (an event stream's events each).
type checkedAPI struct {
	report func(error) // t.Error, in the suites
	v      *specValidator
	next   http.Handler
}

// checkedBodyMax bounds the body kept for validation. A JSON answer is kept
// whole but for its long strings (jsonShrinker), so however long a job's
// output, its answer's shape is validated; another answer larger than this
// (an artifact, an event stream of many megabytes) is validated by its
// status and headers.
const checkedBodyMax = 64 << 20

// shrunkString is what jsonShrinker keeps of a long string: a multiple of
// four bytes, so a base64 value stays base64.
const shrunkString = 64 << 10

func (c *checkedAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/metrics") {
		c.next.ServeHTTP(w, r)
		return
	}
	rec := &teeWriter{ResponseWriter: w}
	// A handler that aborts (http.ErrAbortHandler) broke its answer on
	// purpose: nothing to validate.
	defer func() {
		if p := recover(); p != nil {
			panic(p)
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		req := r.Clone(r.Context())
		req.Body = http.NoBody
		got := c.v.check(req, nil, rec.status, rec.Header(), rec.body())
		for _, err := range got.errs {
			c.report(fmt.Errorf("an answer of the API disagrees with producer/openapi.json: %w", err))
		}
	}()
	c.next.ServeHTTP(rec, r)
}

// teeWriter is an http.ResponseWriter that keeps what it writes (see
// checkedBodyMax) and the status, and passes flushes on (event streams).
type teeWriter struct {
	http.ResponseWriter
	status  int
	buf     bytes.Buffer
	over    bool          // past checkedBodyMax: the body is not kept
	decided bool          // json is set or not, from the first write
	json    *jsonShrinker // a JSON answer's writer into buf
}

func (w *teeWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.decided {
		w.decided = true
		if mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type")); mt == "application/json" || strings.HasSuffix(mt, "+json") {
			w.json = &jsonShrinker{out: &w.buf}
		}
	}
	switch {
	case w.json != nil:
		w.json.write(b)
	case !w.over && w.buf.Len()+len(b) > checkedBodyMax:
		w.over = true
		w.buf = bytes.Buffer{}
	case !w.over:
		w.buf.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

// body is what was kept of the answer, nil when it was not.
func (w *teeWriter) body() []byte {
	if w.over {
		return nil
	}
	return append([]byte{}, w.buf.Bytes()...)
}

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer
// (deadlines, flushes).
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// jsonShrinker copies a JSON text to out, cutting every string value
// longer than shrunkString bytes to its first shrunkString (never inside
// an escape sequence), so an answer holding a job's 100 MB of output is
// kept as kilobytes of the same shape.
type jsonShrinker struct {
	out      *bytes.Buffer
	inString bool
	escape   int  // bytes of the current escape sequence still to come
	n        int  // bytes of the current string kept
	dropping bool // past shrunkString in the current string
}

func (j *jsonShrinker) write(b []byte) {
	for _, c := range b {
		if !j.inString {
			j.out.WriteByte(c)
			if c == '"' {
				j.inString, j.n, j.dropping, j.escape = true, 0, false, 0
			}
			continue
		}
		switch {
		case j.escape > 0:
			if c == 'u' && j.escape == 1 {
				j.escape = 5 // u already read: four hex digits follow
			}
			j.escape--
		case c == '\\':
			j.escape = 1
			if !j.dropping && j.n >= shrunkString {
				j.dropping = true
			}
		case c == '"':
			j.inString = false
			j.out.WriteByte(c)
			continue
		default:
			if !j.dropping && j.n >= shrunkString {
				j.dropping = true
			}
		}
		if !j.dropping {
			j.out.WriteByte(c)
			j.n++
		}
	}
}

// The check can fail: answers that break the document (a runtime with a
// field it does not have; a pending session call answered as a
// zero-valued result, as it once was) are reported, a documented one is
// not. No service is needed: the handler is a fake.
func TestCheckedAPIReportsUndocumentedAnswers(t *testing.T) {
	t.Parallel()
	id := "01a20809-db07-708e-9cae-be326c9bacf6"
	answers := map[string]string{
		"/v1/runtimes": `{"runtimes":[{"bogus":1}]}`,
		"/v1/sessions/" + id + "/calls/2": `{"id":"","status":"","stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,` +
			`"stdout_bytes":0,"stderr_bytes":0,"wall_ms":0,"cpu_ms":0,"memory_peak_bytes":0,"image":{"name":"","digest":""},` +
			`"cache_hit":false,"seq":2,"incarnation":0,"state_restored":false,"pending":true}`,
		"/v1/sessions/" + id + "/calls/3": `{"seq":3,"status":"running","pending":true,"links":{"self":"/s","wait":"/w","events":"/e"}}`,
	}
	fake := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		status := http.StatusOK
		if strings.Contains(r.URL.Path, "/calls/") {
			status = http.StatusAccepted
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(answers[r.URL.Path]))
	})
	var mu sync.Mutex
	reported := map[string]int{}
	ca := &checkedAPI{v: specValidatorFor(t, "http://kiln.test"), next: fake, report: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		for path := range answers {
			if strings.Contains(err.Error(), path+":") {
				reported[path]++
			}
		}
	}}
	for path := range answers {
		req := httptest.NewRequest(http.MethodGet, "http://kiln.test"+path, nil)
		ca.ServeHTTP(httptest.NewRecorder(), req)
	}
	if reported["/v1/runtimes"] == 0 || reported["/v1/sessions/"+id+"/calls/2"] == 0 {
		t.Errorf("undocumented answers not reported: %v", reported)
	}
	if n := reported["/v1/sessions/"+id+"/calls/3"]; n != 0 {
		t.Errorf("a documented pending call reported %d times", n)
	}
}

// A long string is cut, never inside an escape, and the JSON stays JSON of
// the same shape; short strings and everything else pass untouched.
func TestJSONShrinker(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("ab\"\\\n\u00e9", shrunkString) // escapes throughout
	in, _ := json.Marshal(map[string]any{"stdout": long, "b64": strings.Repeat("QUJD", shrunkString), "n": 1, "s": "short \"quoted\""})
	var out bytes.Buffer
	j := &jsonShrinker{out: &out}
	for i := 0; i < len(in); i += 7 { // written in pieces, as a handler does
		j.write(in[i:min(i+7, len(in))])
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("shrunk JSON does not parse: %v\n%.300s", err, out.Bytes())
	}
	if s, _ := got["stdout"].(string); len(s) == 0 || len(s) > shrunkString || !strings.HasPrefix(long, s[:len(s)-8]) {
		t.Errorf("stdout shrunk to %d bytes", len(s))
	}
	if b, _ := got["b64"].(string); len(b) != shrunkString || len(b)%4 != 0 {
		t.Errorf("base64 shrunk to %d bytes", len(b))
	}
	if got["n"] != float64(1) || got["s"] != "short \"quoted\"" || out.Len() > 3*shrunkString {
		t.Errorf("shrunk: n %v, s %q, %d bytes", got["n"], got["s"], out.Len())
	}
}
