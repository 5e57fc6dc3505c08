package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/job"
)

const testJobID = "0190a5e4-7b1c-7d2e-8f3a-123456789abc"

var (
	png    = []byte("\x89PNG\r\n\x1a\nfake")
	latin1 = []byte("name\ncaf\xe9\n")
)

// fakeAPI stands in for the Kiln API's routes the server uses, so the
// mapping of results to MCP content is tested without the pipeline (the
// internal/e2e suite drives `kiln mcp` against the real one).
func fakeAPI(t *testing.T, result job.Result) *httptest.Server {
	t.Helper()
	return fakeAPIWith(t, result, []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}, {Name: "python-slim", Limits: job.DefaultPolicy()}})
}

// fakeAPIWith is fakeAPI serving runtimes.
func fakeAPIWith(t *testing.T, result job.Result, runtimes []job.RuntimeInfo) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": runtimes})
	})
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		var spec job.Spec
		if err := json.NewDecoder(r.Body).Decode(&spec); err != nil || spec.Runtime != "python-slim" || spec.Limits.TimeoutMS != 2000 {
			t.Errorf("submitted spec %+v (%v)", spec, err)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(result)
	})
	// The artifact route serves the type sniffed from the content.
	mux.HandleFunc("GET /v1/jobs/{id}/artifacts/{name...}", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("name") {
		case "plots/a.png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		case "page.png": // named .png, but HTML
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte("<html>"))
		case "latin1.csv": // sniffed as text, but not UTF-8
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write(latin1)
		default:
			http.NotFound(w, r)
		}
	})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs
}

func connect(t *testing.T, api *httptest.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	s, err := New(ctx, Config{BaseURL: api.URL, APIKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func TestArtifactsAsResourcesAndImages(t *testing.T) {
	res := job.Result{ID: testJobID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "done\n"}
	// The artifacts part of a Result as the API documents it.
	if err := json.Unmarshal([]byte(`[{"name":"plots/a.png","size":12,"sha256":"`+strings.Repeat("a", 64)+`","content_type":"image/png"},`+
		`{"name":"page.png","size":6,"sha256":"`+strings.Repeat("b", 64)+`","content_type":"text/html; charset=utf-8"},`+
		`{"name":"gone.csv","size":4,"sha256":"`+strings.Repeat("c", 64)+`","content_type":"text/csv"}]`), &res.Artifacts); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, fakeAPI(t, res))
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 2 || tools.Tools[1].Name != "run_python_slim" {
		t.Fatalf("tools %+v %v", tools, err)
	}
	out, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python_slim", Arguments: map[string]any{"code": "plot()", "timeout_s": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if out.IsError || len(out.Content) != 5 {
		t.Fatalf("want text, three resource links and one image (the real PNG); got %d items, is_error %v", len(out.Content), out.IsError)
	}
	text := out.Content[0].(*mcp.TextContent).Text
	link := out.Content[1].(*mcp.ResourceLink)
	img := out.Content[2].(*mcp.ImageContent)
	page := out.Content[3].(*mcp.ResourceLink)
	csv := out.Content[4].(*mcp.ResourceLink)
	if !strings.Contains(text, "stdout:\ndone") || !strings.Contains(text, "- plots/a.png (image/png): /v1/jobs/"+testJobID+"/artifacts/plots%2Fa.png\n") ||
		link.URI != "kiln://jobs/"+testJobID+"/artifacts/plots%2Fa.png" || link.Name != "plots/a.png" || link.MIMEType != "image/png" ||
		string(img.Data) != string(png) || img.MIMEType != "image/png" || page.Name != "page.png" || csv.Name != "gone.csv" {
		t.Fatalf("content: %q %+v %+v %+v %+v", text, link, img, page, csv)
	}

	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: link.URI})
	if err != nil || len(rr.Contents) != 1 || string(rr.Contents[0].Blob) != string(png) || rr.Contents[0].MIMEType != "image/png" {
		t.Fatalf("read %s: %+v %v", link.URI, rr, err)
	}
	rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: page.URI})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "<html>" || rr.Contents[0].MIMEType != "text/html" {
		t.Fatalf("read %s: %+v %v", page.URI, rr, err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: csv.URI}); err == nil {
		t.Fatal("reading a missing artifact should fail")
	}
}

// A text artifact that is not UTF-8 is read back as its exact bytes (a
// blob), not as a string with its bytes replaced.
func TestNonUTF8TextResourceIsABlob(t *testing.T) {
	cs := connect(t, fakeAPI(t, job.Result{}))
	uri := "kiln://jobs/" + testJobID + "/artifacts/latin1.csv"
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil || len(rr.Contents) != 1 {
		t.Fatalf("read %s: %+v %v", uri, rr, err)
	}
	if c := rr.Contents[0]; string(c.Blob) != string(latin1) || c.Text != "" || c.MIMEType != "text/plain" {
		t.Errorf("read %s: text %q, blob %q, type %q; want the exact bytes as a blob", uri, c.Text, c.Blob, c.MIMEType)
	}
}

func TestBadInputIsAToolError(t *testing.T) {
	cs := connect(t, fakeAPI(t, job.Result{}))
	out, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"source": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if text := out.Content[0].(*mcp.TextContent).Text; !out.IsError || !strings.Contains(text, `unknown input "source"`) {
		t.Fatalf("is_error %v: %s", out.IsError, text)
	}
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func TestHTTPHandlerWantsTheToken(t *testing.T) {
	ctx := context.Background()
	s, err := New(ctx, Config{BaseURL: fakeAPI(t, job.Result{}).URL, APIKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.HTTPHandler("s3cret"))
	t.Cleanup(hs.Close)
	resp, err := http.Post(hs.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}
	for token, ok := range map[string]bool{"wrong": false, "s3cret": true} {
		tr := &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, tr, nil)
		if !ok {
			if err == nil {
				cs.Close()
				t.Fatal("connected with a wrong token")
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(ctx, nil)
		cs.Close()
		if err != nil || len(tools.Tools) != 2 {
			t.Fatalf("tools with the token: %+v %v", tools, err)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:8090": true, "[::1]:1": true, "localhost:1": true, ":8090": false, "0.0.0.0:1": false, "10.0.0.1:80": false} {
		if Loopback(addr) != want {
			t.Errorf("Loopback(%q) = %v", addr, !want)
		}
	}
}

// A call whose request carries a progress token gets notifications/progress
// while its job runs, with growing progress; its result still comes.
func TestProgressWhileTheJobRuns(t *testing.T) {
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
	})
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": testJobID, "status": "running"})
	})
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release: // the job ends once the client has seen progress
		case <-r.Context().Done():
			return
		}
		_ = json.NewEncoder(w).Encode(job.Result{ID: testJobID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "done\n"})
	})
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	ctx := t.Context()
	s, err := New(ctx, Config{BaseURL: api.URL, ProgressInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	var mu sync.Mutex
	var seen []float64
	var once sync.Once
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			if req.Params.ProgressToken != "tok-1" {
				t.Errorf("progress token %v", req.Params.ProgressToken)
			}
			seen = append(seen, req.Params.Progress)
			if len(seen) == 3 {
				once.Do(func() { close(release) })
			}
		}}).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time; time.sleep(90)"}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "done") {
		t.Fatalf("call: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 3 || seen[2] <= seen[0] {
		t.Fatalf("progress %v; want at least 3, growing", seen)
	}
}

// A key the API refuses is an auth error the model is told not to retry,
// not an internal error.
func TestRefusedKeyIsNotRetryable(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
	})
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:kiln:problem:unauthorized", "title": "Unauthorized", "status": 401, "detail": "unknown API key"})
	})
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	cs := connect(t, api)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || !res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	for _, want := range []string{"error_category: unauthorized", "retry_same_call_can_help: false", "do not retry", "unknown API key"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
}

// Errors the server answers with carry a valid JSON-RPC code (a plain Go
// error would go out as code 0).
func TestRPCErrorCodes(t *testing.T) {
	for _, err := range []error{context.Canceled, errors.New("artifact x: the API answered 500")} {
		var we *jsonrpc.Error
		if !errors.As(rpcError(err), &we) || we.Code != jsonrpc.CodeInternalError || we.Message != err.Error() {
			t.Errorf("rpcError(%v) = %#v", err, rpcError(err))
		}
	}
	nf := &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "x"}
	if rpcError(nf) != error(nf) {
		t.Errorf("a JSON-RPC error with a code is kept")
	}
}

// A quota or a cap reached is not a fault: the tool result names the quota
// category, says whether the same call can help, and what to do, never
// internal with "make the same call again later".
func TestQuotaRefusalsAreNotRetryableFaults(t *testing.T) {
	for _, c := range []struct {
		typ, retryAfter string
		status          int
		retry           bool
		what            string
	}{
		// Retry-After past the client's 60 s of retries, as the API sends
		// it for a day's CPU: the client gives up at once.
		{job.QuotaProblemType(job.QuotaCPUDay), "36000", 429, false, "CPU time for the day is used up"},
		{job.QuotaProblemType(job.QuotaQueued), "600", 429, false, "wait for some to finish"},
		{job.ProblemQuotaPrefix + "sessions", "600", 429, false, "end one"},
		{string(job.ProblemBudgetExhausted), "", 409, false, "new budget"},
		{job.QuotaProblemType(job.QuotaRate), "120", 429, true, "wait 2m0s"},
	} {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
		})
		mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			if c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			w.WriteHeader(c.status)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": c.typ, "title": "Refused", "status": c.status, "detail": "the detail of " + c.typ})
		})
		api := httptest.NewServer(mux)
		cs := connect(t, api)
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
		api.Close()
		if err != nil || !res.IsError {
			t.Fatalf("%s: %v %+v", c.typ, err, res)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		for _, want := range []string{"error_category: quota_exceeded", fmt.Sprintf("retry_same_call_can_help: %t", c.retry), c.what, "the detail of " + c.typ} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: the text lacks %q:\n%s", c.typ, want, text)
			}
		}
		if strings.Contains(text, "internal") || strings.Contains(text, "again later") {
			t.Errorf("%s: reported as a fault:\n%s", c.typ, text)
		}
	}
}

// With sessions on, the tools say that state persists; off, that nothing
// does.
func TestSessionToolDescriptions(t *testing.T) {
	no := false
	api := fakeAPIWith(t, job.Result{}, []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()},
		{Name: "node", Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Sessions: &no}}})
	for _, on := range []bool{false, true} {
		s, err := New(t.Context(), Config{BaseURL: api.URL, APIKey: "k1", Sessions: on})
		if err != nil {
			t.Fatal(err)
		}
		st, ct := mcp.NewInMemoryTransports()
		ss, err := s.MCP().Connect(t.Context(), st, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(t.Context(), nil)
		if err != nil || len(tools.Tools) == 0 {
			t.Fatalf("list tools: %v", err)
		}
		for _, tool := range tools.Tools {
			// A runtime without sessions is offered as jobs even with
			// sessions on.
			stateful := on && tool.Name != "run_node"
			d := tool.Description
			if persists := strings.Contains(d, "kept between calls"); persists != stateful || strings.Contains(d, "nothing persists") == stateful {
				t.Errorf("sessions %v, %s: description %q", on, tool.Name, d)
			}
		}
		_ = cs.Close()
		_ = ss.Close()
	}
}

// A stdio client that disconnects, or stops the server with a signal,
// ends it normally: no error, and nothing logged above debug.
func TestServeStdioEndsQuietly(t *testing.T) {
	api := fakeAPI(t, job.Result{})
	for _, how := range []string{"disconnect", "signal"} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		s, err := New(t.Context(), Config{BaseURL: api.URL, APIKey: "k1", Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		st, ct := mcp.NewInMemoryTransports()
		done := make(chan error, 1)
		go func() { done <- s.ServeStdio(ctx, st) }()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		if how == "disconnect" {
			_ = cs.Close()
		} else {
			cancel()
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: ServeStdio = %v", how, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: ServeStdio did not return", how)
		}
		cancel()
		_ = cs.Close()
		if strings.Contains(logs.String(), "level=ERROR") || strings.Contains(logs.String(), "level=WARN") {
			t.Errorf("%s: logged %s", how, logs.String())
		}
	}
}
