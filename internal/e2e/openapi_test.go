package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// specRecorder sends requests to a live API, records each answer and
// validates it against the API's own /openapi.json with kin-openapi's
// openapi3filter: an undocumented status, a missing required field, an
// unknown field or a value outside its enum fails the test.
type specRecorder struct {
	t      *testing.T
	base   string
	key    string
	doc    *openapi3.T
	router routers.Router
	seen   map[string]map[int]bool // "METHOD /path/template" → statuses answered
}

func newSpecRecorder(t *testing.T, base, key string) *specRecorder {
	t.Helper()
	resp, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		t.Fatalf("load /openapi.json: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("/openapi.json is not a valid OpenAPI document: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	r := &specRecorder{t: t, base: base, key: key, doc: doc, router: router, seen: map[string]map[int]bool{}}
	r.record("GET", "/openapi.json", http.StatusOK) // read above; its answer is the document itself
	return r
}

func (r *specRecorder) record(method, tmpl string, status int) {
	k := method + " " + tmpl
	if r.seen[k] == nil {
		r.seen[k] = map[int]bool{}
	}
	r.seen[k][status] = true
}

// call sends a request with the API key (hdr pairs may override headers;
// an empty value removes one) and validates the answer. It returns the
// status and the body.
func (r *specRecorder) call(method, path, body string, hdr ...string) (int, []byte) {
	r.t.Helper()
	return r.send(true, method, path, body, hdr...)
}

// callMixed is call for a request that holds invalid parts the server
// answers within a 200 (a batch item, a tool call's input), so only the
// answer is validated.
func (r *specRecorder) callMixed(method, path, body string) (int, []byte) {
	r.t.Helper()
	return r.send(false, method, path, body)
}

func (r *specRecorder) send(checkRequest bool, method, path, body string, hdr ...string) (int, []byte) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.base+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+r.key)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		r.t.Fatal(err)
	}
	r.validate(req, checkRequest, body, resp, raw)
	return resp.StatusCode, raw
}

// validate checks the answer against the document and, for a request the
// server accepted (2xx), the request too: the document must not refuse
// what the server takes.
func (r *specRecorder) validate(req *http.Request, checkRequest bool, reqBody string, resp *http.Response, raw []byte) {
	r.t.Helper()
	ctx := context.Background()
	route, params, err := r.router.FindRoute(req)
	if err != nil {
		// Not an operation: a 404 for an unknown path or a 405 for another
		// method, answered as the document's shared responses say.
		name, want := "NoSuchEndpoint", http.StatusNotFound
		if err == routers.ErrMethodNotAllowed {
			name, want = "MethodNotAllowed", http.StatusMethodNotAllowed
			if resp.Header.Get("Allow") == "" {
				r.t.Errorf("%s %s: 405 without Allow", req.Method, req.URL.Path)
			}
		}
		if resp.StatusCode != want {
			r.t.Errorf("%s %s is no operation of the document, yet answered %d: %s", req.Method, req.URL.Path, resp.StatusCode, raw)
			return
		}
		mt := r.doc.Components.Responses[name].Value.Content.Get(resp.Header.Get("Content-Type"))
		var v any
		if mt == nil || json.Unmarshal(raw, &v) != nil {
			r.t.Errorf("%s %s: %d answer %q is not the documented problem", req.Method, req.URL.Path, resp.StatusCode, raw)
			return
		}
		if err := mt.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			r.t.Errorf("%s %s: %d answer does not match components.responses.%s: %v\n%s", req.Method, req.URL.Path, resp.StatusCode, name, err, raw)
		}
		r.record(req.Method, "(no operation)", resp.StatusCode)
		return
	}
	if checkRequest && resp.StatusCode < 300 {
		req.Body = io.NopCloser(strings.NewReader(reqBody))
		rin := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
		if err := openapi3filter.ValidateRequest(ctx, rin); err != nil {
			r.t.Errorf("%s %s: the server took a request /openapi.json refuses: %v\nbody: %s", req.Method, req.URL.String(), err, reqBody)
		}
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		r.t.Errorf("%s %s: the %d answer disagrees with /openapi.json: %v\nbody: %s", req.Method, req.URL.String(), resp.StatusCode, err, raw)
	}
	r.record(req.Method, route.Path, resp.StatusCode)
}

// TestOpenAPIDescribesEveryAnswer records real answers of every route of a
// live API (real Redis, JetStream, and a worker on containerd where a route
// needs a run) and validates each against /openapi.json. Adding a field, a
// status or a route without documenting it fails here.
func TestOpenAPIDescribesEveryAnswer(t *testing.T) {
	e := setup(t)
	stopWorker := e.startWorker(t, "e2e-openapi", 1)
	ctx := context.Background()
	const key = "openapi-test-key"
	q := testQueue
	q.MaxMsgs = 10 // so a full queue (429) is reachable
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: q, APIKeys: map[string]string{key: "openapi"},
		MaxBodyBytes: 1 << 20, MaxBatch: 3, RuntimeCacheTTL: 50 * time.Millisecond, ToolCallQueueSlack: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	r := newSpecRecorder(t, hs.URL, key)
	expect := func(want int) func(int, []byte) []byte {
		return func(got int, body []byte) []byte {
			t.Helper()
			if got != want {
				t.Fatalf("status %d, want %d: %s", got, want, body)
			}
			return body
		}
	}
	idOf := func(body []byte) string {
		var v struct{ ID string }
		_ = json.Unmarshal(body, &v)
		return v.ID
	}
	big := `{"code":"` + strings.Repeat("x", 1<<20) + `"}`
	unknownID := job.NewID()

	// Operations.
	expect(200)(r.call("GET", "/healthz", ""))
	expect(200)(r.call("GET", "/readyz", ""))
	expect(405)(r.call("PUT", "/v1/jobs", "{}"))
	expect(404)(r.call("GET", "/v2/jobs", ""))

	// Runtimes and tools.
	expect(200)(r.call("GET", "/v1/runtimes", ""))
	expect(401)(r.call("GET", "/v1/runtimes", "", "Authorization", ""))
	expect(200)(r.call("GET", "/v1/tools?format=anthropic", ""))
	expect(200)(r.call("GET", "/v1/tools?format=openai", ""))
	expect(400)(r.call("GET", "/v1/tools?format=gemini", ""))

	// Submissions: finished (run, then from the cache), accepted, refused.
	done := expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"print('spec')"}`))
	expect(200)(r.call("POST", "/v1/jobs", `{"code":"print('spec')"}`)) // cache hit
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"import sys; sys.exit(2)","cache":false}`))
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"runtime":"python","code":"import os,sys; print(open('d/a.txt').read(), open('b.bin','rb').read(), os.environ['COLOR'], sys.argv[1:], input())",`+
		`"stdin":"in","args":["x"],"env":{"COLOR":"red"},"limits":{"timeout_ms":5000,"memory_mb":128},`+
		`"files":[{"name":"d/a.txt","content":"text","encoding":"utf8"},{"name":"b.bin","content":"AAE=","encoding":"base64"}]}`))
	slow := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"code":"import time; time.sleep(1.5); print(1)","cache":false}`)))
	expect(200)(r.call("GET", "/v1/jobs/"+slow, "")) // pending: an Accepted
	expect(200)(r.call("GET", "/v1/jobs/"+slow+"?wait=30s", ""))
	expect(400)(r.call("POST", "/v1/jobs", `{"code":`))
	expect(400)(r.call("POST", "/v1/jobs", `{"code":"1","memory":5}`))
	expect(400)(r.call("POST", "/v1/jobs?wait=soon", `{"code":"1"}`))
	expect(413)(r.call("POST", "/v1/jobs", big))
	expect(415)(r.call("POST", "/v1/jobs", `code=1`, "Content-Type", "text/plain"))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","runtime":"cobol"}`))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","env":{"PATH":"/x"}}`))
	expect(202)(r.call("POST", "/v1/jobs", `{"code":"print(3)","cache":false}`, "Idempotency-Key", "k-1"))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"print(4)","cache":false}`, "Idempotency-Key", "k-1"))
	expect(401)(r.call("POST", "/v1/jobs", `{"code":"1"}`, "Authorization", "Bearer wrong"))

	// Reading several jobs.
	expect(200)(r.call("GET", "/v1/jobs?ids="+idOf(done)+","+slow+","+unknownID, ""))
	expect(400)(r.call("GET", "/v1/jobs", ""))
	expect(400)(r.call("GET", "/v1/jobs?ids=nope", ""))
	expect(400)(r.call("GET", "/v1/jobs?ids="+strings.Repeat(unknownID+",", 3)+unknownID, ""))

	// Batches.
	expect(200)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print('b')"},{"code":"print('c')","cache":false}]}`))
	expect(200)(r.callMixed("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print('b')"},{"code":""},{"code":"print(5)","limits":{"timeout_ms":-1}}]}`))
	expect(400)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"1"}]}`, "Idempotency-Key", "x"))
	expect(400)(r.call("POST", "/v1/jobs/batch", `{"jobs":[`))
	expect(413)(r.call("POST", "/v1/jobs/batch", `{"jobs":[`+big+`]}`))
	expect(415)(r.call("POST", "/v1/jobs/batch", `{}`, "Content-Type", "text/csv"))
	expect(422)(r.call("POST", "/v1/jobs/batch", `{"jobs":[]}`))
	expect(422)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"1"},{"code":"2"},{"code":"3"},{"code":"4"}]}`))

	// One job.
	expect(400)(r.call("GET", "/v1/jobs/not-an-id", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID, ""))
	expect(400)(r.call("GET", "/v1/jobs/"+slow+"?wait=-1s", ""))

	// Cancel: a running job (202, then canceled), a finished one (200).
	running := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"code":"import time; time.sleep(20)","cache":false}`)))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status == job.StatusRunning })
	expect(202)(r.call("DELETE", "/v1/jobs/"+running, ""))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status.Terminal() })
	expect(200)(r.call("DELETE", "/v1/jobs/"+running, ""))
	expect(400)(r.call("DELETE", "/v1/jobs/x", ""))
	expect(404)(r.call("DELETE", "/v1/jobs/"+unknownID, ""))

	// Tool calls in both formats, and envelopes that are not tool calls.
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_1","name":"run_python","input":{"code":"print(7)"}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"id":"call_1","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"print(1\"}"}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_2","name":"run_java","input":{"code":"x"}}`))
	expect(200)(r.callMixed("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_5","name":"run_python","input":{"source":"x"}}`))
	expect(400)(r.call("POST", "/v1/tool-calls", `{"type":`))
	expect(413)(r.call("POST", "/v1/tool-calls", big))
	expect(415)(r.call("POST", "/v1/tool-calls", `{}`, "Content-Type", "text/plain"))
	expect(422)(r.call("POST", "/v1/tool-calls", `{"type":"text","text":"hi"}`))

	// A full queue: with no worker, MaxMsgs (10) queued jobs are the limit.
	stopWorker()
	var full bool
	for i := 0; i < 12 && !full; i++ {
		st, _ := r.call("POST", "/v1/jobs", fmt.Sprintf(`{"code":"print(%d)","cache":false}`, 100+i))
		full = st == http.StatusTooManyRequests
	}
	if !full {
		t.Fatal("no 429 with the queue full")
	}
	expect(429)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_3","name":"run_python","input":{"code":"print(8)"}}`))

	// Redis gone: the job store is unavailable.
	e.redis.Stop()
	time.Sleep(100 * time.Millisecond) // past RuntimeCacheTTL
	expect(503)(r.call("GET", "/readyz", ""))
	expect(503)(r.call("GET", "/v1/jobs/"+slow, ""))
	expect(503)(r.call("GET", "/v1/jobs?ids="+slow, ""))
	expect(503)(r.call("DELETE", "/v1/jobs/"+slow, ""))
	expect(503)(r.call("POST", "/v1/jobs", `{"code":"print(9)"}`))
	expect(503)(r.call("GET", "/v1/runtimes", ""))
	expect(503)(r.call("GET", "/v1/tools?format=openai", ""))
	expect(503)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_4","name":"run_python","input":{"code":"print(9)"}}`))
	st, body := r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print(10)"}]}`)
	if st != 200 || !bytes.Contains(body, []byte(`"status":503`)) {
		t.Errorf("batch with Redis down: %d %s", st, body)
	}

	// Every operation of the document was exercised.
	var missing, report []string
	for path, item := range r.doc.Paths.Map() {
		for method := range item.Operations() {
			k := method + " " + path
			if len(r.seen[k]) == 0 {
				missing = append(missing, k)
			}
		}
	}
	for k, sts := range r.seen {
		var codes []int
		for c := range sts {
			codes = append(codes, c)
		}
		sort.Ints(codes)
		report = append(report, fmt.Sprintf("%s %v", k, codes))
	}
	sort.Strings(report)
	t.Logf("answers validated:\n%s", strings.Join(report, "\n"))
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("operations of /openapi.json this test never called: %v", missing)
	}
}
