package producer

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// responsesResult is an OpenAI Responses function_call_output item.
type responsesResult struct {
	Type   string `json:"type"`
	CallID string `json:"call_id"`
	Output []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL string `json:"image_url"`
	} `json:"output"`
}

// An OpenAI Responses function_call is answered with a function_call_output
// carrying the text and every image (the display output's, then the image
// artifact's) as input_image data URLs; the same job as a Chat Completions
// call gets the same text, which then names the images and where the API
// serves them.
func TestToolCallOpenAIResponses(t *testing.T) {
	t.Parallel()
	figure := []byte("\x89PNG\r\n\x1a\nfigure")
	saved := []byte("\x89PNG\r\n\x1a\nsaved")
	b := setup(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/jobs/{id}/artifacts/{name...}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "plot.png" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write(saved)
	})
	mux.Handle("/", b.srv.handler)
	b.srv.handler = mux
	var ran job.Spec
	run := func(m job.Message) job.Result {
		ran = m.Spec
		res := succeeded("drawn\n")(m)
		str := func(s string) json.RawMessage { v, _ := json.Marshal(s); return v }
		res.Outputs = []job.Output{{Type: job.OutputDisplay, Data: map[string]json.RawMessage{
			job.MIMEText: str("<Figure size 640x480 with 1 Axes>"), job.MIMEPNG: str(base64.StdEncoding.EncodeToString(figure))}}}
		res.Artifacts = []job.Artifact{{Name: "plot.png", Size: int64(len(saved)), SHA256: strings.Repeat("a", 64), ContentType: "image/png"}}
		return res
	}
	r := toolCall(t, b, `{"type":"function_call","id":"fc_1","call_id":"call_r1","name":"run_python","arguments":"{\"code\":\"draw()\",\"timeout_s\":3}","status":"completed"}`, run)
	var res responsesResult
	r.decode(t, &res)
	if r.StatusCode != http.StatusOK || res.Type != "function_call_output" || res.CallID != "call_r1" || len(res.Output) != 3 {
		t.Fatalf("answer %d %s", r.StatusCode, r.body)
	}
	if ran.Code != "draw()" || ran.Limits.TimeoutMS != 3000 || ran.Runtime != "python" {
		t.Errorf("the job ran %+v", ran)
	}
	id := r.Header.Get("Kiln-Job-Id")
	text := res.Output[0].Text
	for _, want := range []string{"status: succeeded", "stdout:\ndrawn\n", "[1] display:\n<Figure size 640x480 with 1 Axes>\n(image output-1, image/png)\n",
		"- plot.png (image/png): /v1/jobs/" + id + "/artifacts/plot.png\n", "job_id: " + id} {
		if res.Output[0].Type != "input_text" || !strings.Contains(text, want) {
			t.Errorf("input_text lacks %q: %s", want, r.body)
		}
	}
	for i, want := range [][]byte{figure, saved} {
		img := res.Output[i+1]
		if img.Type != "input_image" || img.ImageURL != "data:image/png;base64,"+base64.StdEncoding.EncodeToString(want) {
			t.Errorf("output[%d]: %+v, want %q as a PNG data URL", i+1, img, want)
		}
	}

	// The same result over Chat Completions (another job: the code differs,
	// so the result cache does not answer): the same text, then where the
	// images are.
	r = toolCall(t, b, `{"id":"call_c1","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"draw(2)\",\"timeout_s\":3}"}}`, run)
	var o openAIResult
	r.decode(t, &o)
	id2 := r.Header.Get("Kiln-Job-Id")
	body, note, ok := strings.Cut(o.Content, "images_not_shown: ")
	if !ok || strings.ReplaceAll(body, id2, id) != text {
		t.Errorf("chat completions text differs from the responses one:\n%s\n---\n%s", o.Content, text)
	}
	id = id2
	for _, want := range []string{"carries text only", "- output-1 (image/png): outputs[0].data[\"image/png\"] (base64) of GET /v1/jobs/" + id + "\n",
		"- plot.png (image/png): GET /v1/jobs/" + id + "/artifacts/plot.png\n"} {
		if !strings.Contains(note, want) {
			t.Errorf("the note lacks %q: %s", want, note)
		}
	}

	// The model's mistakes are answered in the call's format.
	r = toolCall(t, b, `{"type":"function_call","call_id":"call_r2","name":"run_python","arguments":"{not json"}`, nil)
	r.decode(t, &res)
	if r.StatusCode != http.StatusOK || res.CallID != "call_r2" || len(res.Output) != 1 || !strings.Contains(res.Output[0].Text, "error_category: invalid_request") {
		t.Errorf("bad arguments: %d %s", r.StatusCode, r.body)
	}
	p := toolCall(t, b, `{"type":"function_call","name":"run_python","arguments":"{}"}`, nil).problem(t, http.StatusUnprocessableEntity)
	if p.Field != "call_id" {
		t.Errorf("a function_call without call_id: %+v", p)
	}
}

// GET /v1/tools?format=openai-responses gives the Responses API's flat
// function tools.
func TestToolsInResponsesFormat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var a toolsAnswer
	r := b.do(t, http.MethodGet, "/v1/tools?format=openai-responses", "")
	r.decode(t, &a)
	if r.StatusCode != http.StatusOK || a.Format != "openai-responses" || len(a.Tools) != 1 {
		t.Fatalf("%d %s", r.StatusCode, r.body)
	}
	tool := a.Tools[0]
	params, _ := tool["parameters"].(map[string]any)
	if tool["type"] != "function" || tool["name"] != "run_python" || tool["strict"] != false || tool["function"] != nil ||
		params["required"] == nil || !strings.Contains(tool["description"].(string), "sandbox") {
		t.Errorf("responses tool: %v", tool)
	}
}
