package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
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
	events []sseEvent              // the events of the last event stream validated
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
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		// kin-openapi decodes no event stream: its status and headers are
		// validated below, its events one by one here.
		opts.ExcludeResponseBody = true
		r.validateEvents(req, route, resp.StatusCode, raw)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                opts,
	}
	in.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		r.t.Errorf("%s %s: the %d answer disagrees with /openapi.json: %v\nbody: %s", req.Method, req.URL.String(), resp.StatusCode, err, raw)
	}
	r.record(req.Method, route.Path, resp.StatusCode)
}

// parseSSE splits an event stream into its events (sseEvent, as
// followEvents reads them); comments (keep-alives) are dropped.
func parseSSE(raw []byte) []sseEvent {
	var out []sseEvent
	for _, block := range strings.Split(string(raw), "\n\n") {
		var ev sseEvent
		var data []string
		for _, line := range strings.Split(block, "\n") {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.id = value
			case "event":
				ev.typ = value
			case "data":
				data = append(data, value)
			}
		}
		if ev.typ != "" || len(data) > 0 {
			ev.data = strings.Join(data, "\n")
			out = append(out, ev)
		}
	}
	return out
}

// validateEvents checks an event stream against the document: the media
// type is documented for its status, and every event is of a type its
// x-events names, with data matching that type's schema.
func (r *specRecorder) validateEvents(req *http.Request, route *routers.Route, status int, raw []byte) {
	r.t.Helper()
	what := fmt.Sprintf("%s %s: %d", req.Method, req.URL.Path, status)
	var mt *openapi3.MediaType
	if resp := route.Operation.Responses.Status(status); resp != nil && resp.Value != nil {
		mt = resp.Value.Content.Get("text/event-stream")
	}
	if mt == nil {
		r.t.Errorf("%s: an event stream the document does not describe", what)
		return
	}
	defs, _ := mt.Extensions["x-events"].(map[string]any)
	r.events = parseSSE(raw)
	if len(r.events) == 0 {
		r.t.Errorf("%s: an event stream without events: %q", what, raw)
	}
	for _, ev := range r.events {
		def, ok := defs[ev.typ]
		if !ok {
			r.t.Errorf("%s: event %q (id %q) is not one of the document's x-events", what, ev.typ, ev.id)
			continue
		}
		schema, err := r.eventSchema(def)
		if err != nil {
			r.t.Errorf("%s: x-events %q: %v", what, ev.typ, err)
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
			r.t.Errorf("%s: event %q data is not JSON: %v\n%s", what, ev.typ, err, ev.data)
			continue
		}
		if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse(), openapi3.MultiErrors()); err != nil {
			r.t.Errorf("%s: event %q disagrees with x-events: %v\ndata: %s", what, ev.typ, err, ev.data)
		}
	}
}

// eventSchema turns an x-events entry (a $ref to a component schema, or an
// array of them) into a schema with its references resolved.
func (r *specRecorder) eventSchema(def any) (*openapi3.Schema, error) {
	b, err := json.Marshal(def)
	if err != nil {
		return nil, err
	}
	var sr openapi3.SchemaRef
	if err := json.Unmarshal(b, &sr); err != nil {
		return nil, err
	}
	var resolve func(*openapi3.SchemaRef) error
	resolve = func(sr *openapi3.SchemaRef) error {
		if sr == nil {
			return nil
		}
		if sr.Ref != "" {
			name, ok := strings.CutPrefix(sr.Ref, "#/components/schemas/")
			c := r.doc.Components.Schemas[name]
			if !ok || c == nil || c.Value == nil {
				return fmt.Errorf("unresolved $ref %q", sr.Ref)
			}
			sr.Value = c.Value
			return nil
		}
		if sr.Value == nil {
			return fmt.Errorf("an empty schema: %s", b)
		}
		return resolve(sr.Value.Items)
	}
	if err := resolve(&sr); err != nil {
		return nil, err
	}
	return sr.Value, nil
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
	t.Cleanup(srv.Close)
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
	expect(200)(r.call("GET", "/v1/tools?format=openai-responses", ""))
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
	// Egress: a key without an allowance, and an entry that is not a host.
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","network":{"allow":["api.example.org"]}}`))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","network":{"allow":["10.0.0.1"]}}`))

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

	// Budgets, replay and the audit log (issue 26).
	bud := idOf(expect(201)(r.call("POST", "/v1/budgets", `{"max_runs":1,"expires_s":600}`)))
	expect(200)(r.call("GET", "/v1/budgets/"+bud, ""))
	expect(400)(r.call("GET", "/v1/budgets/nope", ""))
	expect(404)(r.call("GET", "/v1/budgets/bud_"+strings.Repeat("0", 32), ""))
	expect(422)(r.call("POST", "/v1/budgets", `{}`))
	expect(400)(r.call("POST", "/v1/budgets", `{"max_runs":1,"max_run":1}`))
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"print('budgeted')","cache":false,"budget":"`+bud+`"}`))
	expect(409)(r.call("POST", "/v1/jobs", `{"code":"print('over')","cache":false,"budget":"`+bud+`"}`))
	expect(202)(r.call("POST", "/v1/jobs/"+idOf(done)+"/replay", ""))
	expect(400)(r.call("POST", "/v1/jobs/not-an-id/replay", ""))
	expect(404)(r.call("POST", "/v1/jobs/"+unknownID+"/replay", ""))
	expect(200)(r.call("GET", "/v1/audit?kind=submission&limit=5", ""))
	expect(200)(r.call("GET", "/v1/audit?kind=egress", ""))
	expect(400)(r.call("GET", "/v1/audit?kind=nope", ""))

	// Sessions (issue 24): every operation, and its refusals.
	sess := idOf(expect(201)(r.call("POST", "/v1/sessions", `{"runtime":"python"}`)))
	expect(422)(r.call("POST", "/v1/sessions", `{"runtime":"python","idle_timeout_s":-1}`))
	expect(200)(r.call("GET", "/v1/sessions", ""))
	expect(200)(r.call("GET", "/v1/sessions/"+sess, ""))
	expect(404)(r.call("GET", "/v1/sessions/"+unknownID, ""))
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/exec?wait=60s", `{"code":"open('n.txt', 'w').write('hi')"}`))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/calls/1", ""))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/calls/1/events", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/calls/99", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/calls/99/events", ""))
	expect(200)(r.call("PUT", "/v1/sessions/"+sess+"/files/in.txt", "data", "Content-Type", "application/octet-stream"))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/files/n.txt", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/files/nope.txt", ""))
	expect(200)(r.call("DELETE", "/v1/sessions/"+sess, ""))
	expect(410)(r.call("POST", "/v1/sessions/"+sess+"/exec", `{"code":"1"}`))

	// One job.
	expect(400)(r.call("GET", "/v1/jobs/not-an-id", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID, ""))
	expect(400)(r.call("GET", "/v1/jobs/"+slow+"?wait=-1s", ""))

	// Live events of a job that prints and leaves files, then its artifacts.
	artJob := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"cache":false,"code":"import os,sys,time\ntime.sleep(1)\nprint('live')\nprint('warn', file=sys.stderr)\n`+
		`out = os.environ['KILN_OUTPUT_DIR']\nopen(out + '/notes.txt', 'w').write('n' * 2000)\nopen(out + '/blob.bin', 'wb').write(bytes(range(256)))"}`)))
	expect(200)(r.call("GET", "/v1/jobs/"+artJob+"/events", "")) // followed live until its result
	types := map[string]bool{}
	for _, ev := range r.events {
		types[ev.typ] = true
	}
	for _, want := range []string{job.EventStatus, job.EventStdout, job.EventStderr, job.EventArtifacts, job.EventResult} {
		if !types[want] {
			t.Errorf("the live event stream has no %q event: %+v", want, r.events)
		}
	}
	if last := r.events[len(r.events)-1]; last.typ != job.EventResult {
		t.Errorf("the event stream ends with %q, not the result", last.typ)
	}
	expect(200)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Last-Event-ID", r.events[0].id)) // finished: the result at once
	if len(r.events) != 1 || r.events[0].typ != job.EventResult {
		t.Errorf("a finished job's stream: %+v; want its result only", r.events)
	}
	expect(400)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Last-Event-ID", "yesterday"))
	expect(400)(r.call("GET", "/v1/jobs/not-an-id/events", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID+"/events", ""))
	expect(401)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Authorization", ""))

	var artRes struct{ Artifacts []job.Artifact }
	_ = json.Unmarshal(expect(200)(r.call("GET", "/v1/jobs/"+artJob, "")), &artRes)
	etag := map[string]string{}
	for _, a := range artRes.Artifacts {
		etag[a.Name] = `"` + a.SHA256 + `"`
	}
	if len(etag) != 2 || etag["notes.txt"] == "" || etag["blob.bin"] == "" {
		t.Fatalf("artifacts %+v; want notes.txt and blob.bin", artRes.Artifacts)
	}
	art := "/v1/jobs/" + artJob + "/artifacts/"
	expect(200)(r.call("GET", art+"notes.txt", ""))
	if b := expect(200)(r.call("GET", art+"blob.bin", "")); len(b) != 256 {
		t.Errorf("blob.bin: %d bytes", len(b))
	}
	if b := expect(206)(r.call("GET", art+"blob.bin", "", "Range", "bytes=10-19")); !bytes.Equal(b, []byte{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}) {
		t.Errorf("bytes=10-19 of blob.bin: %v", b)
	}
	expect(304)(r.call("GET", art+"notes.txt", "", "If-None-Match", etag["notes.txt"]))
	expect(412)(r.call("GET", art+"notes.txt", "", "If-Match", etag["blob.bin"]))
	expect(416)(r.call("GET", art+"blob.bin", "", "Range", "bytes=256-"))
	expect(404)(r.call("GET", art+"nope.txt", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID+"/artifacts/notes.txt", ""))
	expect(400)(r.call("GET", "/v1/jobs/not-an-id/artifacts/notes.txt", ""))
	expect(401)(r.call("GET", art+"notes.txt", "", "Authorization", ""))

	// Cancel: a running job (202, then canceled), a finished one (200).
	running := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"code":"import time; time.sleep(20)","cache":false}`)))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status == job.StatusRunning })
	expect(202)(r.call("DELETE", "/v1/jobs/"+running, ""))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status.Terminal() })
	expect(200)(r.call("DELETE", "/v1/jobs/"+running, ""))
	expect(400)(r.call("DELETE", "/v1/jobs/x", ""))
	expect(404)(r.call("DELETE", "/v1/jobs/"+unknownID, ""))

	// Tool calls in the three formats (a figure's image in each answer that
	// carries images), and envelopes that are not tool calls.
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_1","name":"run_python","input":{"code":"print(7)"}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"id":"call_1","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"print(1\"}"}}`))
	const figure = `import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n`
	figureArgs, _ := json.Marshal(fmt.Sprintf(`{"code":%q,"timeout_s":60}`, figure))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"function_call","id":"fc_1","call_id":"call_2","name":"run_python","arguments":`+string(figureArgs)+`}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_6","name":"run_python","input":{"code":`+strconv.Quote(figure)+`,"timeout_s":60}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"id":"call_3","type":"function","function":{"name":"run_python","arguments":`+string(figureArgs)+`}}`))
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
	// Once the runtime registry's cached copy (RuntimeCacheTTL) is stale.
	testkit.Eventually(t, 10*time.Second, "GET /v1/runtimes to answer 503", func() bool {
		st, _ := r.call("GET", "/v1/runtimes", "")
		return st == http.StatusServiceUnavailable
	})
	expect(503)(r.call("GET", "/readyz", ""))
	expect(503)(r.call("GET", "/v1/jobs/"+slow, ""))
	expect(503)(r.call("GET", "/v1/jobs?ids="+slow, ""))
	expect(503)(r.call("GET", art+"notes.txt", ""))
	expect(503)(r.call("GET", "/v1/jobs/"+artJob+"/events", ""))
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
