package producer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// toolsAnswer is GET /v1/tools's body.
type toolsAnswer struct {
	Format string           `json:"format"`
	Tools  []map[string]any `json:"tools"`
}

func TestToolsFollowRegisteredRuntimes(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	b := setup(t, func(c *Config) { c.Now = clock.Now })
	info := job.RuntimeInfo{Name: "python-slim", Image: "kiln/python-slim:3", Digest: testDigest, Limits: job.DefaultPolicy()}
	if err := b.store.RegisterRuntime(context.Background(), info, time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(b.srv.cfg.RuntimeCacheTTL) // the API reads the registry again

	var a toolsAnswer
	r := b.do(t, http.MethodGet, "/v1/tools?format=anthropic", "")
	if r.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", r.StatusCode, r.body)
	}
	r.decode(t, &a)
	names := map[string]map[string]any{}
	for _, tool := range a.Tools {
		names[tool["name"].(string)] = tool
	}
	py, ok := names["run_python"]
	if !ok || names["run_python_slim"] == nil || len(a.Tools) != 2 {
		t.Fatalf("tools %v, want run_python and run_python_slim", names)
	}
	schema := py["input_schema"].(map[string]any)
	props := schema["properties"].(map[string]any)
	for _, p := range []string{"code", "stdin", "files", "timeout_s"} {
		if props[p] == nil {
			t.Errorf("input_schema lacks %s: %v", p, props)
		}
	}
	if fmt.Sprint(schema["required"]) != "[code]" || props["timeout_s"].(map[string]any)["maximum"] != 300.0 {
		t.Errorf("schema: required %v, timeout_s %v", schema["required"], props["timeout_s"])
	}
	if py["description"] == "" || py["type"] != nil {
		t.Errorf("anthropic tool shape: %v", py)
	}

	var o toolsAnswer
	b.do(t, http.MethodGet, "/v1/tools?format=openai", "").decode(t, &o)
	fn, _ := o.Tools[0]["function"].(map[string]any)
	if o.Format != "openai" || o.Tools[0]["type"] != "function" || fn["parameters"] == nil || !strings.HasPrefix(fn["name"].(string), "run_python") {
		t.Fatalf("openai tools: %+v", o.Tools)
	}

	for _, q := range []string{"", "?format=gemini"} {
		p := b.do(t, http.MethodGet, "/v1/tools"+q, "").problem(t, http.StatusBadRequest)
		if p.Field != "format" || !strings.Contains(p.Detail, "anthropic") || !strings.Contains(p.Detail, "openai") {
			t.Errorf("%q: problem %+v does not name the allowed formats", q, p)
		}
	}
}

// toolCall posts a tool call while a stand-in worker answers the job with run.
func toolCall(t *testing.T, b *bundle, body string, run func(job.Message) job.Result) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	if run != nil {
		go func() { _, err := b.worker(t, ctx, run); errc <- err }()
	}
	r := b.do(t, http.MethodPost, "/v1/tool-calls", body)
	if run != nil {
		if err := <-errc; err != nil {
			t.Fatalf("worker: %v", err)
		}
	}
	return r
}

type anthropicResult struct {
	Type      string `json:"type"`
	ToolUseID string `json:"tool_use_id"`
	IsError   bool   `json:"is_error"`
	Content   []struct {
		Type   string `json:"type"`
		Text   string `json:"text"`
		Source struct {
			Type      string `json:"type"`
			MediaType string `json:"media_type"`
			Data      string `json:"data"`
		} `json:"source"`
	} `json:"content"`
}

type openAIResult struct {
	Role       string `json:"role"`
	ToolCallID string `json:"tool_call_id"`
	Content    string `json:"content"`
}

func TestToolCallAnthropicSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ran job.Spec
	r := toolCall(t, b, `{"type":"tool_use","id":"toolu_01","name":"run_python","input":{"code":"print(input())","stdin":"hi","timeout_s":2.5,"files":[{"name":"a.txt","content":"x"}]}}`,
		func(m job.Message) job.Result { ran = m.Spec; return succeeded("hi\n")(m) })
	var res anthropicResult
	r.decode(t, &res)
	if r.StatusCode != http.StatusOK || res.Type != "tool_result" || res.ToolUseID != "toolu_01" || res.IsError || len(res.Content) != 1 {
		t.Fatalf("answer %d %s", r.StatusCode, r.body)
	}
	text := res.Content[0].Text
	for _, want := range []string{"status: succeeded", "exit_code: 0", "wall_time_ms: 12", "stdout:\nhi\n", "stderr:\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if ran.Code != "print(input())" || ran.Stdin != "hi" || ran.Limits.TimeoutMS != 2500 || len(ran.Files) != 1 || ran.Runtime != "python" {
		t.Errorf("the job ran %+v", ran)
	}
	if id := r.Header.Get("Kiln-Job-Id"); !job.ValidID(id) || !strings.Contains(text, "job_id: "+id) {
		t.Errorf("Kiln-Job-Id %q; text %s", id, text)
	}
}

func TestToolCallOpenAISyntaxError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := toolCall(t, b, `{"id":"call_7","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"print(1\"}"}}`,
		func(job.Message) job.Result {
			res := job.Result{Status: job.StatusFailed, ExitCode: job.IntPtr(1), WallMS: 30,
				Error: job.NewFailure(job.CategorySyntaxError, "SyntaxError: '(' was never closed (line 1)")}
			res.SetOutput(nil, []byte("SyntaxError: '(' was never closed\n"))
			return res
		})
	var res openAIResult
	r.decode(t, &res)
	if res.Role != "tool" || res.ToolCallID != "call_7" {
		t.Fatalf("answer %s", r.body)
	}
	for _, want := range []string{"status: failed", "exit_code: 1", "error_category: syntax_error",
		"retry_with_changed_code_can_help: yes", "retry_same_call_can_help: false", "stderr:\nSyntaxError"} {
		if !strings.Contains(res.Content, want) {
			t.Errorf("content lacks %q:\n%s", want, res.Content)
		}
	}
}

// A model's mistakes come back as failed tool results it can act on; a
// caller's mistakes as problems.
func TestToolCallBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ body, want string }{
		{`{"type":"tool_use","id":"t1","name":"run_cobol","input":{"code":"x"}}`, `unknown tool "run_cobol"; the tools are: run_python`},
		{`{"type":"tool_use","id":"t2","name":"run_python","input":{"source":"x"}}`, `unknown input "source"`},
		{`{"type":"tool_use","id":"t3","name":"run_python","input":{}}`, "code is empty"},
		{`{"type":"tool_use","id":"t4","name":"run_python","input":{"code":"x","timeout_s":999}}`, "timeout_s is out of range"},
		{`{"type":"tool_use","id":"t5","name":"run_python","input":{"code":"x","files":[{"name":"../x","content":""}]}}`, "files[0].name"},
	} {
		r := toolCall(t, b, tc.body, nil)
		var res anthropicResult
		r.decode(t, &res)
		if r.StatusCode != http.StatusOK || !res.IsError || len(res.Content) == 0 ||
			!strings.Contains(res.Content[0].Text, tc.want) || !strings.Contains(res.Content[0].Text, "error_category: invalid_request") {
			t.Errorf("%s: answer %d %s, want a failed result saying %q", tc.body, r.StatusCode, r.body, tc.want)
		}
	}
	r := toolCall(t, b, `{"id":"c","type":"function","function":{"name":"run_python","arguments":"{not json"}}`, nil)
	var o openAIResult
	r.decode(t, &o)
	if o.ToolCallID != "c" || !strings.Contains(o.Content, "not valid JSON") {
		t.Errorf("bad arguments: %s", r.body)
	}
	for _, tc := range []struct {
		body, field string
		status      int
	}{
		{`{"type":"text","text":"hi"}`, "type", http.StatusUnprocessableEntity},
		{`{"type":"tool_use","name":"run_python","input":{}}`, "id", http.StatusUnprocessableEntity},
		{`{"id":"x","type":"function"}`, "function", http.StatusUnprocessableEntity},
		{`[1]`, "", http.StatusBadRequest},
	} {
		p := toolCall(t, b, tc.body, nil).problem(t, tc.status)
		if p.Field != tc.field {
			t.Errorf("%s: problem field %q, want %q (%+v)", tc.body, p.Field, tc.field, p)
		}
	}
	if recs, _ := b.jobKeys(t); recs != 0 {
		t.Errorf("%d jobs recorded for calls that should not run", recs)
	}
}

func TestToolCallArtifacts(t *testing.T) {
	t.Parallel()
	png := []byte("\x89PNG\r\n\x1a\nfake")
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-art": "tester"} })
	// The artifact route, as a server with artifacts serves it (the type
	// sniffed from the content): tool calls read images through it, with the
	// caller's key.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/jobs/{id}/artifacts/{name...}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k-art" {
			http.NotFound(w, r)
			return
		}
		switch r.PathValue("name") {
		case "plots/a.png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		case "page.png": // named .png, but HTML
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte("<html>"))
		default:
			http.NotFound(w, r)
		}
	})
	mux.Handle("/", b.srv.handler)
	b.srv.handler = mux
	// The artifacts part of a Result as the API documents it.
	var arts []job.Artifact
	if err := json.Unmarshal([]byte(`[{"name":"plots/a.png","size":12,"sha256":"`+strings.Repeat("a", 64)+`","content_type":"image/png"},`+
		`{"name":"page.png","size":6,"sha256":"`+strings.Repeat("b", 64)+`","content_type":"text/html; charset=utf-8"},`+
		`{"name":"data.csv","size":4,"sha256":"`+strings.Repeat("c", 64)+`","content_type":"text/csv"}]`), &arts); err != nil {
		t.Fatal(err)
	}
	run := func(m job.Message) job.Result {
		res := succeeded("")(m)
		res.Artifacts = arts
		return res
	}
	r := toolCall(t, b, `{"type":"tool_use","id":"t","name":"run_python","input":{"code":"plot()"}}`, run)
	var res anthropicResult
	r.decode(t, &res)
	id := r.Header.Get("Kiln-Job-Id")
	if len(res.Content) != 2 || res.Content[1].Type != "image" || res.Content[1].Source.MediaType != "image/png" ||
		res.Content[1].Source.Data != base64.StdEncoding.EncodeToString(png) {
		t.Fatalf("want the text and only the real PNG inline: %s", r.body)
	}
	for _, want := range []string{"- plots/a.png (image/png): /v1/jobs/" + id + "/artifacts/plots%2Fa.png\n",
		"- page.png (text/html): /v1/jobs/" + id + "/artifacts/page.png\n", "- data.csv (text/csv): /v1/jobs/" + id + "/artifacts/data.csv\n"} {
		if !strings.Contains(res.Content[0].Text, want) {
			t.Errorf("text lacks %q: %s", want, res.Content[0].Text)
		}
	}
	r = toolCall(t, b, `{"id":"c","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"plot(2)\"}"}}`, run)
	var o openAIResult
	r.decode(t, &o)
	if !strings.Contains(o.Content, "/artifacts/plots%2Fa.png") || !strings.Contains(o.Content, "/artifacts/data.csv") {
		t.Errorf("openai result lacks the artifact links: %s", r.body)
	}
}

// A tool call outlives the server's WriteTimeout (sized for MaxWait
// long-polls) when its job needs longer: the call moves its own deadline.
func TestToolCallOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hs := httptest.NewUnstartedServer(b.srv.Handler())
	const writeTimeout = 100 * time.Millisecond
	hs.Config.WriteTimeout = writeTimeout
	hs.Start()
	t.Cleanup(hs.Close)
	b.http = hs
	// The job's run lasts three write timeouts.
	r := toolCall(t, b, `{"type":"tool_use","id":"t","name":"run_python","input":{"code":"slow()"}}`,
		func(m job.Message) job.Result { time.Sleep(3 * writeTimeout); return succeeded("late\n")(m) })
	var res anthropicResult
	r.decode(t, &res)
	if res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, "stdout:\nlate\n") {
		t.Fatalf("answer %d %s", r.StatusCode, r.body)
	}
}

// A caller that will run its tool calls in a session (Kiln-Session-Id)
// gets tools that say state persists; without it, that nothing does.
func TestToolsDescribeSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, hdr := range [][]string{nil, {HeaderSessionID, "new"}} {
		r := b.do(t, http.MethodGet, "/v1/tools?format=anthropic", "", hdr...)
		var got struct {
			Tools []struct{ Description string } `json:"tools"`
		}
		r.decode(t, &got)
		if r.StatusCode != http.StatusOK || len(got.Tools) == 0 {
			t.Fatalf("GET /v1/tools: %d %s", r.StatusCode, r.body)
		}
		d := got.Tools[0].Description
		inSession := hdr != nil
		if strings.Contains(d, "kept between calls") != inSession || strings.Contains(d, "nothing persists") == inSession {
			t.Errorf("with Kiln-Session-Id %v: %q", inSession, d)
		}
	}
}
