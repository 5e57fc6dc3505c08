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
