package e2bapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kilnrun/kiln/e2bapi/envdpb"
	"github.com/kilnrun/kiln/e2bapi/envdpb/envdpbconnect"
	"github.com/kilnrun/kiln/job"
)

// fakeDomain records what the surface asks of the domain; a unit test of
// the mapping only (internal/e2e runs the real domain).
type fakeDomain struct {
	mu      sync.Mutex
	spec    job.SessionSpec
	tags    job.Metadata
	calls   []job.SessionCall
	release chan struct{} // when set, RunCall waits for it
	status  string
	// command, when set, answers the session's command calls.
	command func(call job.SessionCall) *job.CallResult
	// follow, when set, makes a call that is followed (RunCall with a short
	// wait) pending, and is the reading of its events (FollowCall).
	follow func(fn func(typ string, data []byte) error) *job.CallResult
	// interrupted hears the calls InterruptCall is asked for, when set.
	interrupted chan int64
	// contexts are sessions GetSession answers by id before s1's.
	contexts map[string]job.Session
	// files, when set, are the session's files GetSession answers.
	files []job.SessionFileEntry
}

var errNotFound = errors.New("not found")

func (f *fakeDomain) Authenticate(ctx context.Context, key string) (context.Context, string, error) {
	if key != "e2b_aa" {
		return ctx, "", errNotFound
	}
	return ctx, "acme", nil
}
func (f *fakeDomain) AuthenticateSession(ctx context.Context, id, token string) (context.Context, string, error) {
	if id != "s1" || token != "tok-s1" {
		return ctx, "", errNotFound
	}
	return ctx, "acme", nil
}
func (f *fakeDomain) SessionToken(_ context.Context, id string) string { return "tok-" + id }
func (f *fakeDomain) CreateSession(_ context.Context, _ string, spec job.SessionSpec) (job.Session, error) {
	f.spec = spec
	return job.Session{ID: "s1", Status: job.SessionReady, Metadata: spec.Metadata}, nil
}
func (f *fakeDomain) GetSession(_ context.Context, _, id string) (job.Session, []job.SessionFileEntry, error) {
	if v, ok := f.contexts[id]; ok {
		return v, nil, nil
	}
	st := f.status
	if st == "" {
		st = job.SessionReady
	}
	files := []job.SessionFileEntry{{Name: "a/b.txt", Size: 3, Mode: 0o644}, {Name: "c.txt", Size: 1, Mode: 0o600}}
	f.mu.Lock()
	if f.files != nil {
		files = slices.Clone(f.files)
	}
	f.mu.Unlock()
	return job.Session{ID: id, Status: st, IdleTimeoutS: 300, Metadata: job.Metadata{metaTemplate: "base", "user": "u"}}, files, nil
}
func (f *fakeDomain) ListSessions(_ context.Context, _ string, tags job.Metadata) ([]job.Session, error) {
	f.tags = tags
	var out []job.Session
	for _, v := range f.contexts {
		if v.Metadata.Matches(tags) {
			out = append(out, v)
		}
	}
	return out, nil
}
func (f *fakeDomain) DeleteSession(context.Context, string, string) (job.Session, error) {
	return job.Session{}, nil
}
func (f *fakeDomain) PauseSession(context.Context, string, string, time.Duration) (job.Session, bool, error) {
	return job.Session{}, true, nil
}
func (f *fakeDomain) ResumeSession(context.Context, string, string) (job.Session, error) {
	return job.Session{}, nil
}
func (f *fakeDomain) RunCall(ctx context.Context, _, _ string, call job.SessionCall, wait time.Duration) (*job.CallResult, *job.CallPending, error) {
	if f.follow != nil && wait < time.Second {
		p := job.NewCallPending("s1", 1, job.CallRunning)
		return nil, &p, nil
	}
	f.mu.Lock()
	f.calls = append(f.calls, call)
	f.mu.Unlock()
	if f.release != nil {
		<-f.release
	}
	if f.command != nil && call.Command != nil {
		return f.command(call), nil, nil
	}
	return &job.CallResult{Seq: 1, Result: job.Result{Status: job.StatusSucceeded, Stdout: "ok\n"}}, nil, nil
}
func (f *fakeDomain) AwaitCall(context.Context, string, string, int64, time.Duration) (*job.CallResult, *job.CallPending, error) {
	return nil, nil, errors.New("not asked")
}
func (f *fakeDomain) FollowCall(_ context.Context, _, _ string, _ int64, fn func(typ string, data []byte) error) (*job.CallResult, error) {
	if f.follow == nil {
		return nil, errors.New("not asked")
	}
	return f.follow(fn), nil
}
func (f *fakeDomain) InterruptCall(_ context.Context, _, _ string, seq int64) error {
	if f.interrupted != nil {
		f.interrupted <- seq
	}
	return nil
}
func (f *fakeDomain) OpenSessionFile(context.Context, string, string, string) (io.ReadCloser, int64, error) {
	return nil, 0, errNotFound
}
func (f *fakeDomain) MaxWait() time.Duration { return time.Minute }

func serve(t *testing.T, f *fakeDomain, opts ...Option) *httptest.Server {
	hs := httptest.NewServer(New(f, slog.New(slog.NewTextHandler(io.Discard, nil)), opts...))
	t.Cleanup(hs.Close)
	return hs
}

func send(t *testing.T, hs *httptest.Server, method, path, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestCreateMapsTheSandbox(t *testing.T) {
	f := &fakeDomain{}
	hs := serve(t, f)
	resp, body := send(t, hs, "POST", "/v2/sandboxes", `{"templateID":"code-interpreter-v1","timeout":7200,"metadata":{"user":"u"},"envVars":{"A":"1"},"secure":true}`, "X-API-Key", "e2b_aa")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var sb sandbox
	_ = json.Unmarshal([]byte(body), &sb)
	if sb.SandboxID != "s1" || sb.EnvdAccessToken != "tok-s1" || sb.TrafficAccessToken != "tok-s1" || sb.EnvdVersion != envdVersion || sb.TemplateID != "code-interpreter-v1" {
		t.Errorf("answer: %+v", sb)
	}
	s := f.spec
	if s.Runtime != "python" || s.IdleTimeoutS != 7200 || s.MaxLifetimeS != 7200 || s.Metadata["user"] != "u" || s.Env["A"] != "1" || len(s.Metadata) != 2 || s.Metadata[metaTemplate] != "code-interpreter-v1" {
		t.Errorf("spec: %+v", s)
	}
	if resp, body := send(t, hs, "POST", "/sandboxes", `{"templateID":"my-own"}`, "X-API-Key", "e2b_aa"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an unknown template: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(t, hs, "POST", "/sandboxes", `{"metadata":{"e2b.template":"x"}}`, "X-API-Key", "e2b_aa"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a reserved metadata key: %d %s", resp.StatusCode, body)
	}
}

func TestGetHidesKilnsMetadataAndListFilters(t *testing.T) {
	f := &fakeDomain{}
	hs := serve(t, f)
	_, body := send(t, hs, "GET", "/sandboxes/s1", "", "X-API-Key", "e2b_aa")
	var d sandboxDetail
	_ = json.Unmarshal([]byte(body), &d)
	if len(d.Metadata) != 1 || d.Metadata["user"] != "u" || d.TemplateID != "base" || d.State != "running" || d.EnvdAccessToken != "tok-s1" {
		t.Errorf("detail: %s", body)
	}
	send(t, hs, "GET", "/v2/sandboxes?metadata=user%3Du%26team%3Dt&state=running", "", "X-API-Key", "e2b_aa")
	if f.tags["user"] != "u" || f.tags["team"] != "t" || len(f.tags) != 2 {
		t.Errorf("tags: %v", f.tags)
	}
}

func TestTimeoutWithinTheIdleTimeoutIsACall(t *testing.T) {
	f := &fakeDomain{}
	hs := serve(t, f)
	if resp, body := send(t, hs, "POST", "/sandboxes/s1/timeout", `{"timeout":60}`, "X-API-Key", "e2b_aa"); resp.StatusCode != http.StatusNoContent || len(f.calls) != 1 {
		t.Errorf("within: %d %s, %d calls", resp.StatusCode, body, len(f.calls))
	}
	if resp, body := send(t, hs, "POST", "/sandboxes/s1/timeout", `{"timeout":301}`, "X-API-Key", "e2b_aa"); resp.StatusCode != http.StatusBadRequest || len(f.calls) != 1 {
		t.Errorf("beyond: %d %s, %d calls", resp.StatusCode, body, len(f.calls))
	}
}

// execute sends POST /execute with body to sandbox s1 and returns the
// answer, its body open.
func execute(ctx context.Context, t *testing.T, hs *httptest.Server, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/execute", strings.NewReader(body))
	req.Header.Set(headerSandboxID, "s1")
	req.Header.Set(headerSandboxPort, portJupyter)
	req.Header.Set(headerTrafficToken, "tok-s1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestExecuteStreamsKeepAlivesThenTheResult(t *testing.T) {
	f := &fakeDomain{release: make(chan struct{})}
	hs := serve(t, f, WithKeepAlive(10*time.Millisecond))
	resp := execute(t.Context(), t, hs, `{"code":"print(1)","env_vars":{"B":"2"}}`)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || sc.Text() != `{"type":"keepalive"}` {
		t.Fatalf("first line %q", sc.Text())
	}
	close(f.release)
	var types []string
	for sc.Scan() {
		var m map[string]any
		_ = json.Unmarshal(sc.Bytes(), &m)
		if m["type"] != "keepalive" {
			types = append(types, m["type"].(string))
		}
	}
	if strings.Join(types, ",") != "stdout,number_of_executions,end_of_execution" {
		t.Errorf("lines: %v", types)
	}
	// The sandbox's envVars are its session's env, which the domain
	// merges; the call carries its own.
	if env := f.calls[0].Env; len(env) != 1 || env["B"] != "2" {
		t.Errorf("the call's env: %v", env)
	}
}

// A call's output reaches the client while the call runs; the end carries
// only what the stream did not (the result holds all of it).
func TestExecuteStreamsOutputAsItComes(t *testing.T) {
	seen := make(chan struct{})
	f := &fakeDomain{follow: func(fn func(typ string, data []byte) error) *job.CallResult {
		_ = fn(job.EventStatus, []byte(`{"status":"running"}`))
		_ = fn(job.EventStdout, []byte(`{"data":"a\n"}`))
		<-seen // the client has the first line while the call "runs"
		_ = fn(job.EventStderr, []byte(`{"data_base64":"/w=="}`))
		return &job.CallResult{Seq: 2, Result: job.Result{Status: job.StatusSucceeded, Stdout: "a\nb\n", Stderr: "\ufffd"}}
	}}
	hs := serve(t, f, WithKeepAlive(time.Hour))
	resp := execute(t.Context(), t, hs, `{"code":"print('a'); print('b')"}`)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || sc.Text() != `{"text":"a\n","type":"stdout"}` {
		t.Fatalf("first line %q", sc.Text())
	}
	close(seen)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	want := []string{"{\"text\":\"\uFFFD\",\"type\":\"stderr\"}", `{"text":"b\n","type":"stdout"}`,
		`{"execution_count":2,"type":"number_of_executions"}`, `{"type":"end_of_execution"}`}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines after the first:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// A client that goes away while its code runs interrupts the call; one
// that reads to the end does not.
func TestExecuteOfAClientGoneInterruptsTheCall(t *testing.T) {
	f := &fakeDomain{interrupted: make(chan int64, 1), follow: func(fn func(typ string, data []byte) error) *job.CallResult {
		_ = fn(job.EventStdout, []byte(`{"data":"a\n"}`))
		for fn(job.EventStdout, []byte(`{"data":"."}`)) == nil {
		}
		return nil // the reading ended with its client
	}}
	hs := serve(t, f, WithKeepAlive(time.Hour))
	ctx, cancel := context.WithCancel(t.Context())
	resp := execute(ctx, t, hs, `{"code":"while True: print('.')"}`)
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first line")
	}
	cancel() // the client goes away
	resp.Body.Close()
	if seq := <-f.interrupted; seq != 1 {
		t.Errorf("interrupted call %d, want 1", seq)
	}

	f = &fakeDomain{interrupted: make(chan int64, 1), follow: func(func(string, []byte) error) *job.CallResult {
		return &job.CallResult{Seq: 1, Result: job.Result{Status: job.StatusSucceeded}}
	}}
	hs = serve(t, f, WithKeepAlive(time.Hour))
	resp, body := send(t, hs, "POST", "/execute", `{"code":"1"}`, headerSandboxID, "s1", headerSandboxPort, portJupyter, headerTrafficToken, "tok-s1")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "end_of_execution") || len(f.interrupted) != 0 {
		t.Errorf("a call read to its end: %d %s, %d interrupts", resp.StatusCode, body, len(f.interrupted))
	}
}

func TestDataPlaneNeedsTheSandboxToken(t *testing.T) {
	hs := serve(t, &fakeDomain{})
	for _, tok := range []string{"", "tok-other"} {
		resp, body := send(t, hs, "GET", "/contexts", "", headerSandboxID, "s1", headerSandboxPort, portJupyter, headerAccessToken, tok)
		if resp.StatusCode == http.StatusOK {
			t.Errorf("token %q: %d %s", tok, resp.StatusCode, body)
		}
	}
	resp, body := send(t, hs, "GET", "/health", "", headerSandboxID, "s1", headerSandboxPort, portEnvd, headerAccessToken, "tok-other")
	if resp.StatusCode != http.StatusInternalServerError && resp.StatusCode != http.StatusBadGateway {
		t.Errorf("envd health with another token: %d %s", resp.StatusCode, body)
	}
	resp, body = send(t, hs, "GET", "/health", "", headerSandboxID, "s1", headerSandboxPort, portEnvd, headerAccessToken, "tok-s1")
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("envd health: %d %s", resp.StatusCode, body)
	}
}

func TestFilesystemListsAndStatsTheCheckpoint(t *testing.T) {
	hs := serve(t, &fakeDomain{})
	c := envdpbconnect.NewFilesystemClient(http.DefaultClient, hs.URL, connect.WithProtoJSON())
	auth := func(r connect.AnyRequest) {
		r.Header().Set(headerSandboxID, "s1")
		r.Header().Set(headerSandboxPort, portEnvd)
		r.Header().Set(headerAccessToken, "tok-s1")
	}
	ctx := context.Background()
	req := connect.NewRequest(&envdpb.ListDirRequest{Path: "/home/user", Depth: 1})
	auth(req)
	res, err := c.ListDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range res.Msg.Entries {
		got = append(got, e.Type.String()+":"+e.Path)
	}
	if strings.Join(got, " ") != "FILE_TYPE_DIRECTORY:/home/user/a FILE_TYPE_FILE:/home/user/c.txt" {
		t.Errorf("depth 1: %v", got)
	}
	req = connect.NewRequest(&envdpb.ListDirRequest{Path: "/home/user", Depth: 2})
	auth(req)
	if res, err = c.ListDir(ctx, req); err != nil || len(res.Msg.Entries) != 3 {
		t.Errorf("depth 2: %v %v", res, err)
	}
	st := connect.NewRequest(&envdpb.StatRequest{Path: "a/b.txt"})
	auth(st)
	if sr, err := c.Stat(ctx, st); err != nil || sr.Msg.Entry.Size != 3 || sr.Msg.Entry.Permissions != "-rw-r--r--" {
		t.Errorf("stat: %v %v", sr, err)
	}
	st = connect.NewRequest(&envdpb.StatRequest{Path: "/home/user/nope"})
	auth(st)
	if _, err := c.Stat(ctx, st); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat of nothing: %v", err)
	}
	st = connect.NewRequest(&envdpb.StatRequest{Path: "/etc/passwd"})
	auth(st)
	if _, err := c.Stat(ctx, st); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("stat outside /work: %v", err)
	}
}

// A code context is a session of its own: reached by its id under its
// sandbox only, never as a sandbox; a language Kiln does not serve, or a
// context and a language both, are 400.
func TestCodeContexts(t *testing.T) {
	js := job.Session{ID: "c1", Status: job.SessionReady, Metadata: job.Metadata{metaContextOf: "s1", metaLanguage: "javascript", metaDefault: "true"}}
	f := &fakeDomain{contexts: map[string]job.Session{"c1": js}}
	hs := serve(t, f)
	jupyter := []string{headerSandboxID, "s1", headerSandboxPort, portJupyter, headerTrafficToken, "tok-s1"}
	resp, body := send(t, hs, "GET", "/contexts", "", jupyter...)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"id":"kiln-python","language":"python"`) || !strings.Contains(body, `"id":"c1","language":"javascript"`) {
		t.Errorf("GET /contexts: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct{ body, want string }{
		{`{"code":"1","language":"r"}`, "not served"},
		{`{"code":"1","language":"python","context_id":"c1"}`, "not both"},
		{`{"code":"1","context_id":"c9"}`, "not found"},
	} {
		resp, body := send(t, hs, "POST", "/execute", c.body, jupyter...)
		if resp.StatusCode/100 != 4 || !strings.Contains(body, c.want) {
			t.Errorf("execute %s: %d %s", c.body, resp.StatusCode, body)
		}
	}
	if resp, body := send(t, hs, "GET", "/sandboxes/c1", "", "X-API-Key", "e2b_aa"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a context as a sandbox: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(t, hs, "DELETE", "/contexts/kiln-python", "", jupyter...); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("removing the sandbox's own context: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(t, hs, "POST", "/contexts", `{"language":"javascript","cwd":"/tmp"}`, jupyter...); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a context in another cwd: %d %s", resp.StatusCode, body)
	}
	// A restart ends the context's interpreter by a call of its session.
	for _, c := range []struct{ ctx, code string }{{"kiln-python", `__import__("os")._exit(0)`}, {"c1", "process.reallyExit(0)"}} {
		if resp, body := send(t, hs, "POST", "/contexts/"+c.ctx+"/restart", "", jupyter...); resp.StatusCode != http.StatusNoContent || f.calls[len(f.calls)-1].Code != c.code {
			t.Errorf("restart %s: %d %s, calls %+v", c.ctx, resp.StatusCode, body, f.calls)
		}
	}
	if resp, body := send(t, hs, "POST", "/contexts/c9/restart", "", jupyter...); resp.StatusCode != http.StatusNotFound {
		t.Errorf("restart of no context: %d %s", resp.StatusCode, body)
	}
	resp, body = send(t, hs, "POST", "/contexts", `{"language":"js"}`, jupyter...)
	if resp.StatusCode != http.StatusOK || f.spec.Runtime != "node" || f.spec.Metadata[metaContextOf] != "s1" || f.spec.Metadata[metaDefault] != "" {
		t.Errorf("POST /contexts: %d %s, spec %+v", resp.StatusCode, body, f.spec)
	}
}
