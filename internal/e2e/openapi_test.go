package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// specValidator checks answers of the API against producer/openapi.json
// with kin-openapi's openapi3filter: an undocumented status, a missing
// required field, an unknown field or a value outside its enum is an
// error. Every e2e suite's API answers pass through one (checkedAPI); the
// specRecorder of TestOpenAPIDescribesEveryAnswer also counts what it saw.
type specValidator struct {
	doc    *openapi3.T
	router routers.Router
}

// registerTextDecoders lets kin-openapi read the run page's answers (HTML,
// its style sheet and script) as the strings their schemas say.
var registerTextDecoders = sync.OnceFunc(func() {
	for _, ct := range []string{"text/html", "text/css", "text/javascript"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
})

// newSpecValidator loads raw (the document) for an API at base.
func newSpecValidator(raw []byte, base string) (*specValidator, error) {
	registerTextDecoders()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("load /openapi.json: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("/openapi.json is not a valid OpenAPI document: %w", err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	return &specValidator{doc: doc, router: router}, nil
}

// checked is what check found of one answer: the operation's path
// template ("(no operation)" for an answer of no operation), the events
// of an event stream, and what disagreed with the document.
type checked struct {
	route  string
	events []sseEvent
	errs   []error
}

func (c *checked) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// check validates an answer (status, header, body raw) to req against the
// document and, with reqBody set for an answer the server accepted (2xx),
// the request too: the document must not refuse what the server takes. A
// nil raw is a body not kept (too large to): the status and headers are
// validated.
func (v *specValidator) check(req *http.Request, reqBody *string, status int, header http.Header, raw []byte) checked {
	ctx := context.Background()
	var c checked
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		// A path parameter that holds slashes (an artifact's name, a
		// session file's path: {name...} to the server) is one segment to
		// the router.
		for _, mark := range []string{"/artifacts/", "/files/"} {
			if head, tail, ok := strings.Cut(req.URL.Path, mark); ok && strings.Contains(tail, "/") {
				r2 := req.Clone(req.Context())
				r2.URL.Path, r2.URL.RawPath = head+mark+strings.ReplaceAll(tail, "/", "%2F"), ""
				if rt, ps, err2 := v.router.FindRoute(r2); err2 == nil {
					route, params, err = rt, ps, nil
				}
			}
		}
	}
	if err != nil {
		// Not an operation: a 404 for an unknown path or a 405 for another
		// method, answered as the document's shared responses say.
		c.route = "(no operation)"
		name, want := "NoSuchEndpoint", http.StatusNotFound
		if err == routers.ErrMethodNotAllowed {
			name, want = "MethodNotAllowed", http.StatusMethodNotAllowed
			if header.Get("Allow") == "" {
				c.errorf("%s %s: 405 without Allow", req.Method, req.URL.Path)
			}
		}
		if status != want {
			c.errorf("%s %s is no operation of the document, yet answered %d: %s", req.Method, req.URL.Path, status, raw)
			return c
		}
		mt := v.doc.Components.Responses[name].Value.Content.Get(header.Get("Content-Type"))
		var body any
		if mt == nil || json.Unmarshal(raw, &body) != nil {
			c.errorf("%s %s: %d answer %q is not the documented problem", req.Method, req.URL.Path, status, raw)
			return c
		}
		if err := mt.Schema.Value.VisitJSON(body, openapi3.EnableJSONSchema2020()); err != nil {
			c.errorf("%s %s: %d answer does not match components.responses.%s: %v\n%s", req.Method, req.URL.Path, status, name, err, raw)
		}
		return c
	}
	c.route = route.Path
	if reqBody != nil && status < 300 {
		req.Body = io.NopCloser(strings.NewReader(*reqBody))
		rin := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
		if err := openapi3filter.ValidateRequest(ctx, rin); err != nil {
			c.errorf("%s %s: the server took a request /openapi.json refuses: %v\nbody: %s", req.Method, req.URL.String(), err, *reqBody)
		}
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	if raw == nil && status != http.StatusNoContent && status != http.StatusNotModified {
		opts.ExcludeResponseBody = true
	} else if mt, _, _ := mime.ParseMediaType(header.Get("Content-Type")); mt == "text/event-stream" {
		// kin-openapi decodes no event stream: its status and headers are
		// validated below, its events one by one here.
		opts.ExcludeResponseBody = true
		v.validateEvents(&c, req, route, status, raw)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                opts,
	}
	in.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		c.errorf("%s %s: the %d answer disagrees with /openapi.json: %v\nbody: %s", req.Method, req.URL.String(), status, err, clip(raw))
	}
	return c
}

// clip is at most the first 4 KiB of raw, for a message.
func clip(raw []byte) []byte {
	if len(raw) > 4<<10 {
		return append(raw[:4<<10:4<<10], "..."...)
	}
	return raw
}

// specRecorder sends requests to a live API, records each answer and
// validates it against the API's own /openapi.json (specValidator).
type specRecorder struct {
	*specValidator
	t      *testing.T
	base   string
	key    string
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
	v, err := newSpecValidator(raw, base)
	if err != nil {
		t.Fatal(err)
	}
	r := &specRecorder{specValidator: v, t: t, base: base, key: key, seen: map[string]map[int]bool{}}
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
	// Redirects are answers too (POST /ui/login): not followed.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		r.t.Fatal(err)
	}
	var reqBody *string
	if checkRequest {
		reqBody = &body
	}
	c := r.check(req, reqBody, resp.StatusCode, resp.Header, raw)
	for _, err := range c.errs {
		r.t.Error(err)
	}
	if c.events != nil || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		r.events = c.events
	}
	r.record(req.Method, c.route, resp.StatusCode)
	return resp.StatusCode, raw
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
func (v *specValidator) validateEvents(c *checked, req *http.Request, route *routers.Route, status int, raw []byte) {
	what := fmt.Sprintf("%s %s: %d", req.Method, req.URL.Path, status)
	var mt *openapi3.MediaType
	if resp := route.Operation.Responses.Status(status); resp != nil && resp.Value != nil {
		mt = resp.Value.Content.Get("text/event-stream")
	}
	if mt == nil {
		c.errorf("%s: an event stream the document does not describe", what)
		return
	}
	defs, _ := mt.Extensions["x-events"].(map[string]any)
	c.events = parseSSE(raw)
	if len(c.events) == 0 {
		c.errorf("%s: an event stream without events: %q", what, raw)
	}
	for _, ev := range c.events {
		def, ok := defs[ev.typ]
		if !ok {
			c.errorf("%s: event %q (id %q) is not one of the document's x-events", what, ev.typ, ev.id)
			continue
		}
		schema, err := v.eventSchema(def)
		if err != nil {
			c.errorf("%s: x-events %q: %v", what, ev.typ, err)
			continue
		}
		var body any
		if err := json.Unmarshal([]byte(ev.data), &body); err != nil {
			c.errorf("%s: event %q data is not JSON: %v\n%s", what, ev.typ, err, ev.data)
			continue
		}
		if err := schema.VisitJSON(body, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse(), openapi3.MultiErrors()); err != nil {
			c.errorf("%s: event %q disagrees with x-events: %v\ndata: %s", what, ev.typ, err, clip([]byte(ev.data)))
		}
	}
}

// eventSchema turns an x-events entry (a $ref to a component schema, or an
// array of them) into a schema with its references resolved.
func (v *specValidator) eventSchema(def any) (*openapi3.Schema, error) {
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
			c := v.doc.Components.Schemas[name]
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
