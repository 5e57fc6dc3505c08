package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// postToolCall sends a tool-use block to POST /v1/tool-calls and decodes the
// tool-result block.
func (e *env) postToolCall(t *testing.T, block string) map[string]any {
	t.Helper()
	resp, err := http.Post(e.apiURL+"/v1/tool-calls", "application/json", strings.NewReader(block))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/tool-calls: %d %s", resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return out
}

// Acceptance 1: tool-call round trips in both vendor formats through the
// real pipeline (API, JetStream, worker, containerd sandbox): a success, a
// SyntaxError the model can fix, and a timeout.
func TestToolCallRoundTrips(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "e2e-tools", 2)

	cases := []struct {
		name, code string
		timeoutS   float64
		isError    bool
		want       []string
	}{
		{"success", "import sys\nprint(sum(range(10)))\nprint('note', file=sys.stderr)", 0, false,
			[]string{"status: succeeded", "exit_code: 0", "stdout:\n45\n", "stderr:\nnote\n", "wall_time_ms: "}},
		{"syntax error", "print('unclosed'", 0, true,
			[]string{"status: failed", "error_category: syntax_error", "retry_with_changed_code_can_help: yes", "SyntaxError"}},
		{"timeout", "while True:\n    pass", 1, true,
			[]string{"status: timed_out", "error_category: timeout", "retry_with_changed_code_can_help: maybe", "raise timeout_s (at most 300 s)"}},
	}
	for _, tc := range cases {
		input := map[string]any{"code": tc.code}
		if tc.timeoutS > 0 {
			input["timeout_s"] = tc.timeoutS
		}
		in, _ := json.Marshal(input)
		// The OpenAI call's code differs by a comment, so it runs too rather
		// than being answered from the result cache.
		input["code"] = tc.code + "\n# openai"
		oin, _ := json.Marshal(input)
		args, _ := json.Marshal(string(oin))

		a := e.postToolCall(t, fmt.Sprintf(`{"type":"tool_use","id":"toolu_%d","name":"run_python","input":%s}`, len(tc.name), in))
		content, _ := a["content"].([]any)
		if a["type"] != "tool_result" || a["tool_use_id"] != fmt.Sprintf("toolu_%d", len(tc.name)) || a["is_error"] != tc.isError || len(content) != 1 {
			t.Fatalf("%s (anthropic): %v", tc.name, a)
		}
		text, _ := content[0].(map[string]any)["text"].(string)
		assertContains(t, tc.name+" (anthropic)", text, tc.want)

		o := e.postToolCall(t, fmt.Sprintf(`{"id":"call_%d","type":"function","function":{"name":"run_python","arguments":%s}}`, len(tc.name), args))
		if o["role"] != "tool" || o["tool_call_id"] != fmt.Sprintf("call_%d", len(tc.name)) {
			t.Fatalf("%s (openai): %v", tc.name, o)
		}
		assertContains(t, tc.name+" (openai)", o["content"].(string), tc.want)
	}
}

func assertContains(t *testing.T, what, text string, want []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s: result lacks %q:\n%s", what, w, text)
		}
	}
}
