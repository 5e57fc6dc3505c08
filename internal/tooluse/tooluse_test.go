package tooluse

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestToolName(t *testing.T) {
	for rt, want := range map[string]string{"python": "run_python", "python-slim": "run_python_slim", "node": "run_node"} {
		if got := ToolName(rt); got != want {
			t.Errorf("ToolName(%q) = %q, want %q", rt, got, want)
		}
	}
	defs := Definitions([]job.RuntimeInfo{{Name: "python-slim", Limits: job.DefaultPolicy()}})
	d, err := Lookup(defs, "run_python_slim")
	if err != nil || d.Runtime != "python-slim" {
		t.Fatalf("Lookup: %+v %v", d, err)
	}
	if _, err := Lookup(defs, "run_python"); err == nil || !strings.Contains(err.Error(), "run_python_slim") {
		t.Fatalf("unknown tool error should list the tools: %v", err)
	}
}

func TestParseFormat(t *testing.T) {
	for s, want := range map[string]Format{"anthropic": Anthropic, "openai": OpenAI, "openai-responses": OpenAIResponses} {
		if f, err := ParseFormat(s); err != nil || f != want {
			t.Errorf("%q: %v %v", s, f, err)
		}
	}
	for _, bad := range []string{"", "Anthropic", "gemini", "responses"} {
		_, err := ParseFormat(bad)
		if err == nil || !strings.Contains(err.Error(), "use format=anthropic, format=openai or format=openai-responses") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// Each format's tool definition has its API's shape; the Responses one is
// flat and not strict (strict mode would want every input required).
func TestDefinitionShapes(t *testing.T) {
	d := Define(job.RuntimeInfo{Name: "python", Limits: job.DefaultPolicy()})
	shape := func(f Format) string {
		m := d.Render(f)
		for _, k := range []string{"input_schema", "parameters"} {
			if m[k] != nil {
				m[k] = "schema"
			}
		}
		if fn, ok := m["function"].(map[string]any); ok {
			fn["parameters"], fn["description"] = "schema", "d"
		}
		if m["description"] != nil {
			m["description"] = "d"
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for f, want := range map[Format]string{
		Anthropic:       `{"description":"d","input_schema":"schema","name":"run_python"}`,
		OpenAI:          `{"function":{"description":"d","name":"run_python","parameters":"schema"},"type":"function"}`,
		OpenAIResponses: `{"description":"d","name":"run_python","parameters":"schema","strict":false,"type":"function"}`,
	} {
		if got := shape(f); got != want {
			t.Errorf("%s: %s, want %s", f, got, want)
		}
	}
}

func TestDecodeCall(t *testing.T) {
	c, err := DecodeCall([]byte(`{"type":"tool_use","id":"toolu_1","name":"run_python","input":{"code":"print(1)"}}`))
	if err != nil || c.Format != Anthropic || c.ID != "toolu_1" || c.Name != "run_python" || string(c.Input) != `{"code":"print(1)"}` {
		t.Fatalf("anthropic: %+v %v", c, err)
	}
	c, err = DecodeCall([]byte(`{"id":"call_1","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"1\"}"}}`))
	if err != nil || c.Format != OpenAI || c.ID != "call_1" || string(c.Input) != `{"code":"1"}` || c.InputErr != nil {
		t.Fatalf("openai: %+v %v", c, err)
	}
	c, err = DecodeCall([]byte(`{"id":"call_2","type":"function","function":{"name":"run_python","arguments":"{\"code\":"}}`))
	if err != nil || c.InputErr == nil {
		t.Fatalf("truncated arguments are the model's mistake, not the caller's: %+v %v", c, err)
	}
	// A Responses function_call is answered by its call_id, not its item id.
	c, err = DecodeCall([]byte(`{"type":"function_call","id":"fc_1","call_id":"call_3","name":"run_python","arguments":"{\"code\":\"2\"}","status":"completed"}`))
	if err != nil || c.Format != OpenAIResponses || c.ID != "call_3" || c.Name != "run_python" || string(c.Input) != `{"code":"2"}` || c.InputErr != nil {
		t.Fatalf("openai responses: %+v %v", c, err)
	}
	c, err = DecodeCall([]byte(`{"type":"function_call","call_id":"call_4","name":"run_python","arguments":"{\"code\""}`))
	if err != nil || c.InputErr == nil || c.ID != "call_4" {
		t.Fatalf("bad Responses arguments are the model's mistake: %+v %v", c, err)
	}
	c, err = DecodeCall([]byte(`{"type":"function_call","call_id":"call_5","name":"run_python","arguments":7}`))
	if err != nil || c.InputErr == nil || !strings.Contains(c.InputErr.Error(), "arguments must be a JSON string") || strings.Contains(c.InputErr.Error(), "function.") {
		t.Fatalf("arguments of the wrong type: %+v %v", c, err)
	}
	for bad, field := range map[string]string{
		`{"type":"tool_result"}`: "type", `{"type":"tool_use","name":"x"}`: "id", `{"type":"function","id":"x"}`: "function", `{}`: "type",
		`{"type":"function_call","id":"fc_1","name":"run_python","arguments":"{}"}`: "call_id",
		`{"type":"function_call","call_id":"c","arguments":"{}"}`:                   "name",
		`{"type":"function_call_output","call_id":"c","output":"x"}`:                "type",
	} {
		var ce *CallError
		if _, err := DecodeCall([]byte(bad)); err == nil || !asCallError(err, &ce) || ce.Field != field {
			t.Errorf("%s: %v, want a CallError naming %s", bad, err, field)
		}
	}
}

func asCallError(err error, ce **CallError) bool {
	e, ok := err.(*CallError)
	*ce = e
	return ok
}

func TestDecodeInput(t *testing.T) {
	in, err := DecodeInput(json.RawMessage(`{"code":"x","timeout_s":1.2,"files":[{"name":"a","content":"YQ==","encoding":"base64"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	spec := in.Spec("python")
	if spec.Limits.TimeoutMS != 1200 || spec.Files[0].Encoding != "base64" || spec.Runtime != "python" {
		t.Fatalf("spec %+v", spec)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	for raw, field := range map[string]string{`{"code":""}`: "code", `{"code":"x","timeout":3}`: "timeout", `{"code":1}`: "code", `{"code":"x","timeout_s":-1}`: "timeout_s"} {
		_, err := DecodeInput(json.RawMessage(raw))
		ie, ok := err.(*job.InvalidError)
		if !ok || ie.Field != field {
			t.Errorf("%s: %v, want an invalid %s", raw, err, field)
		}
	}
}

func TestRenderAdvice(t *testing.T) {
	res := job.Result{ID: "j", Status: job.StatusTimedOut, WallMS: 1000, Error: job.NewFailure(job.CategoryTimeout, "killed after 1s"),
		Artifacts: []job.Artifact{{Name: "out/plot.png"}}}
	o := Render(res, "300")
	for _, want := range []string{"status: timed_out", "error_category: timeout", "retry_with_changed_code_can_help: maybe",
		"at most 300 s", "- out/plot.png (image/png): /v1/jobs/j/artifacts/out%2Fplot.png"} {
		if !strings.Contains(o.Text, want) {
			t.Errorf("text lacks %q:\n%s", want, o.Text)
		}
	}
	if !o.IsError || len(o.Artifacts) != 1 {
		t.Fatalf("%+v", o)
	}
	internal := Render(job.Result{Status: job.StatusInternalError, Error: job.NewFailure(job.CategoryInternal, "x")}, "")
	if !strings.Contains(internal.Text, "retry_same_call_can_help: true") {
		t.Errorf("internal errors are retried unchanged:\n%s", internal.Text)
	}
	ok := Render(job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "1"}, "")
	if ok.IsError || !strings.Contains(ok.Text, "stdout:\n1\n") || strings.Contains(ok.Text, "error") {
		t.Errorf("success: %+v", ok)
	}
}

func TestBlockShapes(t *testing.T) {
	o := Reply{Text: "t\n", IsError: true, Images: []Image{{Name: "output-1", MediaType: "image/png", Data: []byte{1}, Where: "outputs[0] of GET /v1/jobs/j"}},
		Artifacts: []ArtifactRef{{Name: "a.png", MediaType: "image/png", Path: "/v1/jobs/j/artifacts/a.png"}, {Name: "b.csv", MediaType: "text/csv", Path: "/v1/jobs/j/artifacts/b.csv"}}}
	a, _ := json.Marshal(Call{Format: Anthropic, ID: "u"}.Block(o))
	if string(a) != `{"content":[{"text":"t\n","type":"text"},{"source":{"data":"AQ==","media_type":"image/png","type":"base64"},"type":"image"}],"is_error":true,"tool_use_id":"u","type":"tool_result"}` {
		t.Errorf("anthropic block %s", a)
	}
	r, _ := json.Marshal(Call{Format: OpenAIResponses, ID: "call_r"}.Block(o))
	if string(r) != `{"call_id":"call_r","output":[{"text":"t\n","type":"input_text"},{"image_url":"data:image/png;base64,AQ==","type":"input_image"}],"type":"function_call_output"}` {
		t.Errorf("openai responses item %s", r)
	}
	// Chat Completions takes text only: the text says where the images are
	// (the output's and the image artifact's, not the CSV).
	var m struct{ Role, ToolCallID, Content string }
	b, _ := json.Marshal(Call{Format: OpenAI, ID: "c"}.Block(o))
	if err := json.Unmarshal(b, &m); err != nil || m.Role != "tool" || !strings.HasPrefix(m.Content, "t\nimages_not_shown: a Chat Completions tool message carries text only") ||
		!strings.HasSuffix(m.Content, "\n- output-1 (image/png): outputs[0] of GET /v1/jobs/j\n- a.png (image/png): GET /v1/jobs/j/artifacts/a.png\n") {
		t.Errorf("openai message %s", b)
	}
	// An image artifact the server inlined is listed once.
	o.Images = append(o.Images, Image{Name: "a.png", MediaType: "image/png", Data: []byte{2}, Where: "GET /v1/jobs/j/artifacts/a.png"})
	if b, _ := json.Marshal(Call{Format: OpenAI, ID: "c"}.Block(o)); strings.Count(string(b), "a.png") != 2 {
		t.Errorf("openai message %s", b)
	}
	plain, _ := json.Marshal(Call{Format: OpenAI, ID: "c"}.Block(Reply{Text: "t"}))
	if string(plain) != `{"content":"t","role":"tool","tool_call_id":"c"}` {
		t.Errorf("openai message without images %s", plain)
	}
}

// Runtimes of one language get different titles and descriptions that
// name their packages and say what comes back.
func TestDefineTellsRuntimesApart(t *testing.T) {
	pkg := func(name, mod string) job.Package {
		return job.Package{Name: name, Version: "1", Modules: []string{mod}}
	}
	full := job.RuntimeInfo{Name: "python", Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Language: "python", Version: "3.11.2",
		Packages: []job.Package{pkg("numpy", "numpy"), pkg("pandas", "pandas"), pkg("matplotlib", "matplotlib"), pkg("scikit-learn", "sklearn")}}}
	slim := job.RuntimeInfo{Name: "python-slim", Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Language: "python", Version: "3.11.2",
		Packages: []job.Package{pkg("numpy", "numpy")}}}
	node := job.RuntimeInfo{Name: "node", Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Language: "javascript", Version: "18.20.4"}}
	a, b, c := Define(full), Define(slim), Define(node)
	if a.Title == b.Title || a.Description == b.Description {
		t.Fatalf("python and python-slim look alike: %q / %q", a.Title, b.Title)
	}
	for _, want := range []string{"pandas", "scikit-learn (import sklearn)", "3.11.2", "last expression", "without savefig", "KILN_OUTPUT_DIR"} {
		if !strings.Contains(a.Description, want) {
			t.Errorf("python's description lacks %q: %s", want, a.Description)
		}
	}
	if strings.Contains(b.Description, "pandas") || strings.Contains(b.Description, "savefig") || !strings.Contains(b.Title, "slim") {
		t.Errorf("python-slim: %q: %s", b.Title, b.Description)
	}
	if strings.Contains(c.Description, "last expression") || !strings.Contains(c.Description, "standard library") {
		t.Errorf("node: %s", c.Description)
	}
}

// Display outputs reach the model as text (HTML reduced to a table of
// text) and images; the exception's fields are in the text.
func TestRenderOutputsAndException(t *testing.T) {
	png := "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	res := job.Result{ID: "j1", Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Outputs: []job.Output{
		{Type: job.OutputResult, Data: map[string]json.RawMessage{job.MIMEText: str("<Styler>"),
			job.MIMEHTML: str("<style>td{}</style><table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>x</td></tr></table>")}},
		{Type: job.OutputDisplay, Data: map[string]json.RawMessage{job.MIMEText: str("<Figure size 640x480 with 1 Axes>"), job.MIMEPNG: str(png)}},
	}, OutputsTruncated: true, OutputsDropped: 3}
	o := Render(res, "")
	for _, want := range []string{"[1] result (last expression):\na | b\n1 | x\n", "[2] display:\n<Figure size 640x480 with 1 Axes>\n(image output-2, image/png)", "outputs_truncated: 3"} {
		if !strings.Contains(o.Text, want) {
			t.Errorf("text lacks %q:\n%s", want, o.Text)
		}
	}
	if strings.Contains(o.Text, "td{}") || len(o.Images) != 1 || o.Images[0].MediaType != "image/png" || len(o.Images[0].Data) == 0 {
		t.Fatalf("images %+v, text:\n%s", o.Images, o.Text)
	}
	if want := `outputs[1].data["image/png"] (base64) of GET /v1/jobs/j1`; o.Images[0].Where != want {
		t.Errorf("where: %q, want %q", o.Images[0].Where, want)
	}
	sc := RenderCall("s1", job.CallResult{Result: res, Seq: 4, StateRestored: true}, "")
	if want := `outputs[1].data["image/png"] (base64) of GET /v1/sessions/s1/calls/4`; len(sc.Images) != 1 || sc.Images[0].Where != want {
		t.Errorf("a session call's image: %+v, want it at %q", sc.Images, want)
	}
	blk := Call{Format: Anthropic, ID: "t"}.Block(o)
	if content := blk["content"].([]map[string]any); len(content) != 2 || content[1]["type"] != "image" {
		t.Errorf("anthropic block: %+v", blk)
	}
	res = job.Result{Status: job.StatusFailed, Error: &job.Failure{Category: job.CategoryRuntimeError, Message: "m",
		Exception: &job.Exception{Type: "ZeroDivisionError", Message: "division by zero", Line: 3, SourceLine: "1/0",
			Frames: []job.Frame{{File: "/work/main.py", Line: 3, Function: "<module>"}}}}}
	o = Render(res, "")
	for _, want := range []string{"exception_type: ZeroDivisionError\n", "exception_line: 3\n", "exception_source_line: 1/0\n", "- /work/main.py:3 in <module>\n"} {
		if !strings.Contains(o.Text, want) {
			t.Errorf("text lacks %q:\n%s", want, o.Text)
		}
	}
}
