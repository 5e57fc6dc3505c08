package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
)

// runningJobAPI stands in for the API's job routes for a job that runs
// until it is canceled: a submission is accepted (202), a long-poll on the
// job lasts until its client leaves (waiting is closed at the first), and
// each DELETE's job id is sent on canceled.
func runningJobAPI(t *testing.T) (api *httptest.Server, waiting <-chan struct{}, canceled <-chan string) {
	t.Helper()
	polled, deleted := make(chan struct{}), make(chan string, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
	})
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": testJobID, "status": "running"})
	})
	var once sync.Once
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(polled) })
		<-r.Context().Done() // a long-poll that outlasts the call
	})
	mux.HandleFunc("DELETE /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		deleted <- r.PathValue("id")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": testJobID, "status": "running", "cancel_requested": true})
	})
	api = httptest.NewServer(mux)
	t.Cleanup(api.Close)
	return api, polled, deleted
}

// A call the client gives up cancels its job, so no sandbox runs for nobody.
func TestCanceledCallCancelsJob(t *testing.T) {
	api, waiting, canceled := runningJobAPI(t)
	cs := connect(t, api)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-waiting; cancel() }()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "while True: pass"}}); err == nil {
		t.Fatal("a canceled call returned a result")
	}
	select {
	case id := <-canceled:
		if id != testJobID {
			t.Fatalf("canceled %s, want %s", id, testJobID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job of a canceled call was not canceled")
	}
}

// A streamable HTTP client that deletes its session mid-call (with no
// notifications/cancelled first) has the call's job canceled.
func TestDeletedSessionCancelsJob(t *testing.T) {
	api, waiting, canceled := runningJobAPI(t)
	s, err := New(t.Context(), Config{BaseURL: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.HTTPHandler(""))
	t.Cleanup(hs.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(),
		&mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sid := cs.ID()
	go func() {
		_, _ = cs.CallTool(context.WithoutCancel(t.Context()), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "while True: pass"}})
	}()
	<-waiting
	req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, hs.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case id := <-canceled:
		if id != testJobID {
			t.Fatalf("canceled %s, want %s", id, testJobID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job of a call whose session was deleted was not canceled")
	}
	_ = cs.Close()
}

// A call given up while its job is being submitted still has that job
// canceled: the submission is not given up with the call, so the job's id
// is known and canceled.
func TestCallGivenUpWhileSubmittingCancelsJob(t *testing.T) {
	api, _, canceled := runningJobAPI(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	hold := &holdRequest{method: http.MethodPost, suffix: "/v1/jobs", next: http.DefaultTransport, release: ctx.Done(), reached: make(chan struct{}, 1)}
	s, err := New(t.Context(), Config{BaseURL: api.URL, HTTPClient: &http.Client{Transport: hold}})
	if err != nil {
		t.Fatal(err)
	}
	rt := job.RuntimeInfo{Name: "python", Limits: job.DefaultPolicy()}
	handler := s.runTool(tooluse.Define(rt), rt, false)
	got := hold.cancelWhileHeld(t, cancel, canceled, func() error {
		_, err := handler(ctx, &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "run_python", Arguments: json.RawMessage(`{"code": "while True: pass"}`)}})
		return err
	})
	if got != testJobID {
		t.Fatalf("canceled %s, want %s", got, testJobID)
	}
}

// holdRequest holds the requests of one method whose path ends in suffix
// until release is closed, then goes on as a transport does: it ends the
// request if the request's own context is done by then.
type holdRequest struct {
	method, suffix string
	next           http.RoundTripper
	release        <-chan struct{}
	reached        chan struct{}
}

// cancelWhileHeld runs call, cancels it (cancel) once its request is
// held, and returns what the API was then asked to cancel (canceled). It
// fails t if the call ends first, answers no error, or nothing is
// canceled within 30 s.
func (h *holdRequest) cancelWhileHeld(t *testing.T, cancel context.CancelFunc, canceled <-chan string, call func() error) string {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- call() }()
	select {
	case <-h.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the call's request was not sent")
	}
	cancel()
	var got string
	select {
	case got = <-canceled:
	case err := <-errc:
		t.Fatalf("the call ended (%v) without canceling what it had sent", err)
	case <-time.After(30 * time.Second):
		t.Fatal("what the call sent as it was canceled was not canceled")
	}
	if err := <-errc; err == nil {
		t.Fatal("the canceled call answered no error")
	}
	return got
}

func (h *holdRequest) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == h.method && strings.HasSuffix(r.URL.Path, h.suffix) {
		select {
		case h.reached <- struct{}{}:
		default:
		}
		<-h.release
		if err := r.Context().Err(); err != nil {
			return nil, err
		}
	}
	return h.next.RoundTrip(r)
}

// A streamable HTTP client that drops the POST carrying its call (and
// sends no notifications/cancelled, nor DELETE) has the call's job
// canceled: without an event store the answer could never reach it.
func TestAbortedPostCancelsJob(t *testing.T) {
	api, waiting, canceled := runningJobAPI(t)
	s, err := New(t.Context(), Config{BaseURL: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.HTTPHandler(""))
	t.Cleanup(hs.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(),
		&mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	// The call, as a client sends it; the POST is dropped once the job runs.
	ctx, abort := context.WithCancel(t.Context())
	defer abort()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL, strings.NewReader(
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"while True: pass"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	req.Header.Set(postHeader, "1") // a client's value is replaced, not trusted
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body) // the stream, until the abort
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-waiting:
	case err := <-errc:
		t.Fatalf("the POST ended before the job ran: %v", err)
	}
	abort()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("the POST ended with %v, want the abort", err)
	}
	select {
	case id := <-canceled:
		if id != testJobID {
			t.Fatalf("canceled %s, want %s", id, testJobID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job of a call whose POST was dropped was not canceled")
	}
}

// A call that begins after its POST was dropped is given up at once; one
// over stdio (no tag) follows nothing.
func TestFollowAPostAlreadyServed(t *testing.T) {
	var p posts
	tag, done := p.open(t.Context())
	done()
	ctx, cancel := context.WithCancel(t.Context())
	p.follow(tag, cancel)()
	if ctx.Err() == nil {
		t.Error("a call of a POST already served was not canceled")
	}
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	p.follow("", cancel)()
	if ctx.Err() != nil {
		t.Error("a call with no POST was canceled")
	}
}
