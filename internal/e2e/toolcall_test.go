package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"regexp"
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

// Acceptance 1: tool-call round trips in the three formats (Anthropic,
// OpenAI Chat Completions and Responses) through the real pipeline (API,
// JetStream, worker, containerd sandbox): a success, a SyntaxError the model
// can fix, a timeout, and a job that leaves artifacts (listed as links in
// every format, the PNG inline in Anthropic's and the Responses API's).
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

		input["code"] = tc.code + "\n# openai responses"
		rin, _ := json.Marshal(input)
		rargs, _ := json.Marshal(string(rin))
		r := e.postToolCall(t, fmt.Sprintf(`{"type":"function_call","id":"fc_%d","call_id":"call_r%d","name":"run_python","arguments":%s}`, len(tc.name), len(tc.name), rargs))
		output, _ := r["output"].([]any)
		if r["type"] != "function_call_output" || r["call_id"] != fmt.Sprintf("call_r%d", len(tc.name)) || len(output) != 1 {
			t.Fatalf("%s (openai responses): %v", tc.name, r)
		}
		assertContains(t, tc.name+" (openai responses)", output[0].(map[string]any)["text"].(string), tc.want)
	}
	t.Run("artifacts", func(t *testing.T) { toolCallArtifacts(t, e) })
}

// plotCode writes a matplotlib PNG and a CSV to the job's output dir.
const plotCode = `
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = os.environ["KILN_OUTPUT_DIR"]
plt.figure(figsize=(2, 2))
plt.plot([1, 2, 3], [1, 4, 9])
plt.savefig(out + "/plot.png")
open(out + "/squares.csv", "w").write("n,sq\n1,1\n2,4\n3,9\n")
print("saved")
`

// artifactLink finds the link a tool result's text gives for an artifact.
func artifactLink(t *testing.T, what, text, name, mediaType string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^- ` + regexp.QuoteMeta(name) + ` \(` + regexp.QuoteMeta(mediaType) + `\): (/v1/jobs/[0-9a-f-]+/artifacts/\S+)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s: no link to %s (%s) in:\n%s", what, name, mediaType, text)
	}
	return m[1]
}

// download follows an artifact link on the API.
func (e *env) download(t *testing.T, link string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(e.apiURL + link)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func toolCallArtifacts(t *testing.T, e *env) {
	in, _ := json.Marshal(map[string]any{"code": plotCode, "timeout_s": 60}) // importing matplotlib cold takes seconds
	a := e.postToolCall(t, `{"type":"tool_use","id":"toolu_art","name":"run_python","input":`+string(in)+`}`)
	content, _ := a["content"].([]any)
	if a["type"] != "tool_result" || a["tool_use_id"] != "toolu_art" || a["is_error"] != false || len(content) != 2 {
		t.Fatalf("anthropic: want the text and one inline image (the PNG, not the CSV): %v", a)
	}
	text, _ := content[0].(map[string]any)["text"].(string)
	assertContains(t, "artifacts (anthropic)", text, []string{"status: succeeded", "stdout:\nsaved\n", "artifacts:\n"})
	pngLink := artifactLink(t, "anthropic", text, "plot.png", "image/png")
	csvLink := artifactLink(t, "anthropic", text, "squares.csv", "text/plain")

	img, _ := content[1].(map[string]any)
	src, _ := img["source"].(map[string]any)
	if img["type"] != "image" || src["type"] != "base64" || src["media_type"] != "image/png" {
		t.Fatalf("anthropic image block: %v", img)
	}
	inline, err := base64.StdEncoding.DecodeString(src["data"].(string))
	if err != nil {
		t.Fatalf("inline image data: %v", err)
	}
	if _, err := png.Decode(bytes.NewReader(inline)); err != nil {
		t.Fatalf("inline image is not a PNG: %v", err)
	}
	// The links are the API's artifact route: they download what was inlined.
	resp, body := e.download(t, pngLink)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/png" || !bytes.Equal(body, inline) {
		t.Errorf("GET %s: %d %s, %d bytes; want the %d inlined bytes", pngLink, resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(inline))
	}
	if resp, body = e.download(t, csvLink); resp.StatusCode != http.StatusOK || string(body) != "n,sq\n1,1\n2,4\n3,9\n" {
		t.Errorf("GET %s: %d %q", csvLink, resp.StatusCode, body)
	}

	// OpenAI's tool message is text only: the artifacts are links there.
	// The code differs by a comment, so this call runs too.
	in, _ = json.Marshal(map[string]any{"code": plotCode + "# openai\n", "timeout_s": 60})
	args, _ := json.Marshal(string(in))
	o := e.postToolCall(t, `{"id":"call_art","type":"function","function":{"name":"run_python","arguments":`+string(args)+`}}`)
	otext, _ := o["content"].(string)
	if o["role"] != "tool" || o["tool_call_id"] != "call_art" {
		t.Fatalf("openai: %v", o)
	}
	assertContains(t, "artifacts (openai)", otext, []string{"status: succeeded", "stdout:\nsaved\n"})
	pngLink = artifactLink(t, "openai", otext, "plot.png", "image/png")
	artifactLink(t, "openai", otext, "squares.csv", "text/plain")
	if !strings.HasSuffix(otext, "images_not_shown: a Chat Completions tool message carries text only; the API serves these images:\n"+
		"- plot.png (image/png): GET "+pngLink+"\n") {
		t.Errorf("openai: the text does not end by naming the image: %s", otext)
	}
	resp, body = e.download(t, pngLink)
	if _, err := png.Decode(bytes.NewReader(body)); resp.StatusCode != http.StatusOK || err != nil {
		t.Errorf("GET %s: %d, PNG decode: %v", pngLink, resp.StatusCode, err)
	}

	// The Responses API's function_call_output carries the PNG as an
	// input_image, the bytes its link serves.
	in, _ = json.Marshal(map[string]any{"code": plotCode + "# openai responses\n", "timeout_s": 60})
	args, _ = json.Marshal(string(in))
	r := e.postToolCall(t, `{"type":"function_call","call_id":"call_rart","name":"run_python","arguments":`+string(args)+`}`)
	output, _ := r["output"].([]any)
	if r["type"] != "function_call_output" || r["call_id"] != "call_rart" || len(output) != 2 {
		t.Fatalf("openai responses: want the text and one input_image (the PNG, not the CSV): %v", r)
	}
	rtext, _ := output[0].(map[string]any)["text"].(string)
	pngLink = artifactLink(t, "openai responses", rtext, "plot.png", "image/png")
	dataURL, _ := output[1].(map[string]any)["image_url"].(string)
	data, ok := strings.CutPrefix(dataURL, "data:image/png;base64,")
	inline, err = base64.StdEncoding.DecodeString(data)
	if output[1].(map[string]any)["type"] != "input_image" || !ok || err != nil {
		t.Fatalf("openai responses image part: %.100v (%v)", output[1], err)
	}
	if resp, body = e.download(t, pngLink); resp.StatusCode != http.StatusOK || !bytes.Equal(body, inline) {
		t.Errorf("GET %s: %d, %d bytes; want the %d inlined bytes", pngLink, resp.StatusCode, len(body), len(inline))
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
