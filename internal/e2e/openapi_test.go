package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
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
