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
	if f, err := ParseFormat("openai"); err != nil || f != OpenAI {
		t.Fatal(f, err)
	}
	for _, bad := range []string{"", "Anthropic", "gemini"} {
		_, err := ParseFormat(bad)
		if err == nil || !strings.Contains(err.Error(), "format=anthropic or format=openai") {
			t.Errorf("%q: %v", bad, err)
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
	for _, bad := range []string{`{"type":"tool_result"}`, `{"type":"tool_use","name":"x"}`, `{"type":"function","id":"x"}`, `{}`} {
		var ce *CallError
		if _, err := DecodeCall([]byte(bad)); err == nil || !asCallError(err, &ce) || ce.Field == "" {
			t.Errorf("%s: %v, want a CallError naming the field", bad, err)
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
	o := Outcome{Text: "t", IsError: true, Images: []Image{{MediaType: "image/png", Data: []byte{1}}}}
	a, _ := json.Marshal(Call{Format: Anthropic, ID: "u"}.Block(o))
	if string(a) != `{"content":[{"text":"t","type":"text"},{"source":{"data":"AQ==","media_type":"image/png","type":"base64"},"type":"image"}],"is_error":true,"tool_use_id":"u","type":"tool_result"}` {
		t.Errorf("anthropic block %s", a)
	}
	b, _ := json.Marshal(Call{Format: OpenAI, ID: "c"}.Block(o))
	if string(b) != `{"content":"t","role":"tool","tool_call_id":"c"}` {
		t.Errorf("openai message %s", b)
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
