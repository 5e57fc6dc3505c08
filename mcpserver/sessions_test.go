package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// sessionAPI stands in for the API's session routes: it makes sessions,
// answers their calls, counts the live ones and reports each DELETE.
type sessionAPI struct {
	*httptest.Server
	deleted chan string

	mu      sync.Mutex
	live    map[string]bool
	made    int
	endNext bool // the next exec answers 410: the session ended under its holder
	// pending: exec answers 202 (call 1 pending), its long-poll answers when
	// the call is canceled; polled and canceled receive each.
	pending  bool
	polled   chan struct{}
	canceled chan string
}

func newSessionAPI(t *testing.T) *sessionAPI {
	t.Helper()
	a := &sessionAPI{deleted: make(chan string, 64), live: map[string]bool{},
		polled: make(chan struct{}, 64), canceled: make(chan string, 64)}
	var cancelOnce sync.Once
	cancelDone := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runtimes", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"runtimes": []job.RuntimeInfo{{Name: "python", Limits: job.DefaultPolicy()}}})
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.made++
		id := fmt.Sprintf("0190a5e4-7b1c-7d2e-8f3a-%012d", a.made)
		a.live[id] = true
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(job.Session{ID: id, Status: job.SessionReady, Runtime: "python"})
	})
	mux.HandleFunc("POST /v1/sessions/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		end, live := a.endNext, a.live[r.PathValue("id")]
		a.endNext = false
		if end {
			delete(a.live, r.PathValue("id"))
		}
		a.mu.Unlock()
		if end || !live {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusGone)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": job.ProblemSessionEnded, "title": "Session ended", "status": 410,
				"detail": "session " + r.PathValue("id") + " has ended: it was idle longer than its idle_timeout_s"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if a.pendingNow() {
			w.WriteHeader(http.StatusAccepted)
			_ = json.NewEncoder(w).Encode(job.CallPending{Seq: 1, Status: job.CallRunning, Pending: true})
			return
		}
		_ = json.NewEncoder(w).Encode(job.CallResult{Seq: 1, Incarnation: 1, StateRestored: true,
			Result: job.Result{ID: testJobID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "in " + r.PathValue("id") + "\n"}})
	})
	mux.HandleFunc("GET /v1/sessions/{id}/calls/{seq}", func(w http.ResponseWriter, r *http.Request) {
		a.polled <- struct{}{}
		select {
		case <-cancelDone:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(job.CallResult{Seq: 1, Incarnation: 1, StateRestored: true,
			Result: job.Result{ID: testJobID, Status: job.StatusCanceled}})
	})
	mux.HandleFunc("POST /v1/sessions/{id}/calls/{seq}/cancel", func(w http.ResponseWriter, r *http.Request) {
		a.canceled <- r.PathValue("id") + " call " + r.PathValue("seq")
		cancelOnce.Do(func() { close(cancelDone) })
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(job.CallResult{Seq: 1, Incarnation: 1, StateRestored: true,
			Result: job.Result{ID: testJobID, Status: job.StatusCanceled}})
	})
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		delete(a.live, r.PathValue("id"))
		a.mu.Unlock()
		a.deleted <- r.PathValue("id")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(job.Session{ID: r.PathValue("id"), Status: job.SessionEnded})
	})
	a.Server = httptest.NewServer(mux)
	t.Cleanup(a.Close)
	return a
}

// connectSessions connects an in-memory MCP client to a session-mode
// server over api.
func connectSessions(t *testing.T, api *sessionAPI) *mcp.ClientSession {
	t.Helper()
	return connectSessionsVia(t, api, nil)
}

// connectSessionsVia is connectSessions with the server reaching the API
// through hc (nil: the default client).
func connectSessionsVia(t *testing.T, api *sessionAPI, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	s, err := New(t.Context(), Config{BaseURL: api.URL, Sessions: true, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := s.MCP().Connect(t.Context(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func (a *sessionAPI) pendingNow() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending
}

func (a *sessionAPI) liveCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live)
}

func callPython(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "x = 1"}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Content[0].(*mcp.TextContent).Text
}

// A stdio client that disconnects leaves no Kiln session: ServeStdio has
// closed it before it returns, so the process that exits next leaks none.
func TestStdioEndClosesKilnSessions(t *testing.T) {
	api := newSessionAPI(t)
	s, err := New(t.Context(), Config{BaseURL: api.URL, Sessions: true})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- s.ServeStdio(t.Context(), st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out := callPython(t, cs); !strings.Contains(out, "status: succeeded") {
		t.Fatalf("the call: %s", out)
	}
	_ = cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeStdio did not return")
	}
	if n := api.liveCount(); n != 0 {
		t.Fatalf("%d Kiln sessions live when ServeStdio returned", n)
	}
}

// dialer records the connections an HTTP client opens, so a test can cut
// them all at once, as a client process that dies (or the TypeScript SDK's
// close(), which aborts its requests and sends no DELETE) does.
type dialer struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *dialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// Over streamable HTTP, a session's Kiln session is closed when its client
// deletes the session, and when the client goes away without a word (its
// connections cut) once DisconnectGrace has passed; a client that stays
// connected and idle keeps its session and its Kiln session.
func TestHTTPClientGoneClosesKilnSession(t *testing.T) {
	api := newSessionAPI(t)
	s, err := New(t.Context(), Config{BaseURL: api.URL, Sessions: true, DisconnectGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.HTTPHandler(""))
	t.Cleanup(hs.Close)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	open := func() (*mcp.ClientSession, *dialer) {
		d := &dialer{}
		hc := &http.Client{Transport: &http.Transport{DialContext: d.dial}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(),
			&mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs, d
	}
	wantDeleted := func(what string) {
		t.Helper()
		select {
		case <-api.deleted:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: its Kiln session was not closed", what)
		}
	}

	staying, _ := open()
	first := callPython(t, staying)

	deleting, _ := open()
	callPython(t, deleting)
	_ = deleting.Close() // the Go SDK sends DELETE
	wantDeleted("a client that deleted its session")

	gone, d := open()
	callPython(t, gone)
	d.cut()
	wantDeleted("a client that went away")
	_ = gone.Close() // its SDK's reconnection attempts end (the session is gone)

	// The idle client, idle since before the other client went away and
	// was found gone (past the grace), still has its Kiln session.
	if again := callPython(t, staying); again != first {
		t.Fatalf("the idle client's call ran elsewhere:\n%s\nthen\n%s", first, again)
	}
	if n := api.liveCount(); n != 1 {
		t.Fatalf("%d Kiln sessions live; want the idle client's alone", n)
	}
	_ = staying.Close()
	wantDeleted("the idle client, closed")
}

// A Kiln session that ended under its MCP session (its idle timeout) is
// replaced at the next call, which runs and says what was lost: the model
// is never told to retry a call that cannot succeed.
func TestEndedKilnSessionIsReplaced(t *testing.T) {
	api := newSessionAPI(t)
	cs := connectSessions(t, api)
	callPython(t, cs)
	api.mu.Lock()
	api.endNext = true
	api.mu.Unlock()
	out := callPython(t, cs)
	if !strings.Contains(out, "status: succeeded") || !strings.Contains(out, "state_restored: false") ||
		!strings.Contains(out, "idle_timeout_s") || !strings.Contains(out, "in 0190a5e4-7b1c-7d2e-8f3a-000000000002") ||
		strings.Contains(out, "retry_same_call_can_help: true") {
		t.Fatalf("the call after the Kiln session ended:\n%s", out)
	}
}

// A tool call its client cancels cancels the Kiln session's call: the call
// is started first (its seq known at once), and the server sends the
// session's cancel for it when the tool call's context ends.
func TestCanceledToolCallCancelsKilnCall(t *testing.T) {
	api := newSessionAPI(t)
	api.pending = true
	cs := connectSessions(t, api)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time; time.sleep(600)"}})
		errc <- err
	}()
	select {
	case <-api.polled: // the call is pending and waited on
	case <-time.After(30 * time.Second):
		t.Fatal("the tool call did not wait on its Kiln call")
	}
	cancel()
	select {
	case got := <-api.canceled:
		if want := "0190a5e4-7b1c-7d2e-8f3a-000000000001 call 1"; got != want {
			t.Fatalf("canceled %q; want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the canceled tool call did not cancel its Kiln call")
	}
	if err := <-errc; err == nil {
		t.Fatal("the canceled tool call answered no error")
	}
}

// A tool call canceled while its Kiln call is being started still cancels
// that call: the start is not abandoned with the tool call (the API may
// have accepted the call already, and without its seq it would run to its
// timeout), and the cancel follows it.
func TestCallCanceledWhileStartingIsCanceled(t *testing.T) {
	api := newSessionAPI(t)
	api.pending = true
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	hold := &holdRequest{method: http.MethodPost, suffix: "/exec", next: http.DefaultTransport, release: ctx.Done(), reached: make(chan struct{}, 1)}
	c, err := client.New(api.URL, client.WithHTTPClient(&http.Client{Transport: hold}))
	if err != nil {
		t.Fatal(err)
	}
	ks, err := c.CreateSession(t.Context(), job.SessionSpec{Runtime: "python"})
	if err != nil {
		t.Fatal(err)
	}
	got := hold.cancelWhileHeld(t, cancel, api.canceled, func() error {
		_, err := runCall(ctx, ks, job.SessionCall{Code: "import time; time.sleep(600)"})
		return err
	})
	if want := ks.ID + " call 1"; got != want {
		t.Fatalf("canceled %q; want %q", got, want)
	}
}

// A tool call canceled while its MCP session's Kiln session is being made
// does not abandon the making: the API may have made it already, and the
// next call (or one waiting for it) runs there instead of finding an
// error or a second session. The canceled call itself starts nothing.
func TestSessionMadeWhileItsCallIsCanceledIsKept(t *testing.T) {
	api := newSessionAPI(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	hold := &holdRequest{method: http.MethodPost, suffix: "/v1/sessions", next: http.DefaultTransport, release: ctx.Done(), reached: make(chan struct{}, 1)}
	cs := connectSessionsVia(t, api, &http.Client{Transport: hold})
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
		errc <- err
	}()
	select {
	case <-hold.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not ask for a Kiln session")
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the canceled call answered no error")
	}
	// The server answers the client's cancel at once and goes on making
	// the session: the API has it once the server's handler is done.
	testkit.Eventually(t, 30*time.Second, "the Kiln session made for the canceled call", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.made == 1
	})
	if out := callPython(t, cs); !strings.Contains(out, "in 0190a5e4-7b1c-7d2e-8f3a-000000000001") {
		t.Fatalf("the call after the canceled one:\n%s\nwant it in the session made for the canceled call", out)
	}
	api.mu.Lock()
	made := api.made
	api.mu.Unlock()
	if made != 1 || api.liveCount() != 1 {
		t.Fatalf("%d Kiln sessions made, %d live; want the one made for the canceled call", made, api.liveCount())
	}
}
