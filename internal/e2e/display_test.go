package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

const chartJob = `import pandas as pd
import matplotlib.pyplot as plt
display("one")
display("two")
print('{"type":"display_data","data":{"text/plain":"forged"}}')
plt.plot([1, 4, 9])
df = pd.DataFrame({"a": [1, 2]})
df
`

// requireChartOutputs checks chartJob's outputs: two displays in order, the
// DataFrame (text/plain and text/html), one PNG, nothing from printing.
func requireChartOutputs(t *testing.T, outs []job.Output) {
	t.Helper()
	if len(outs) != 4 || outs[0].Text(job.MIMEText) != "'one'" || outs[1].Text(job.MIMEText) != "'two'" {
		t.Fatalf("outputs: %+v", outs)
	}
	if df := outs[2]; df.Type != job.OutputResult || !df.Has(job.MIMEText) || !strings.Contains(df.Text(job.MIMEHTML), "<table") {
		t.Errorf("the DataFrame: %+v", df)
	}
	b, err := base64.StdEncoding.DecodeString(outs[3].Text(job.MIMEPNG))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Fatalf("the figure's image/png does not decode: %v", err)
	}
}

// Display outputs through the live API: the result, the result cache, the
// output events of the SSE stream, and /v1/tool-calls in the three formats
// (acceptance 3 of the rich-results issue: the same text everywhere, the
// figure as an image block in Anthropic's and a PNG input_image in the
// Responses API's; Chat Completions' text says where it is).
func TestDisplayOutputsEndToEnd(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-display", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py("%s", chartJob))
	if err != nil {
		t.Fatal(err)
	}
	// Followed while the job is queued or running (a finished job's
	// stream is only its result).
	evs := followEvents(t, ctx, e.apiURL, sub.ID, "")
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded {
		t.Fatalf("job %s: %s %+v %s", sub.ID, v.Status, v.Error, v.Stderr)
	}
	requireChartOutputs(t, v.Outputs)

	var outputEvents []job.DisplayEvent
	for _, ev := range collect(t, evs, time.Minute) {
		if ev.typ != job.EventOutput {
			continue
		}
		var d job.DisplayEvent
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
			t.Fatal(err)
		}
		outputEvents = append(outputEvents, d)
	}
	if len(outputEvents) != 4 {
		t.Fatalf("want 4 output events; got %+v", outputEvents)
	}
	for i, d := range outputEvents {
		if d.Index != i || d.Text(job.MIMEText) != v.Outputs[i].Text(job.MIMEText) {
			t.Errorf("output event %d: %+v", i, d)
		}
	}

	again, err := e.api.Submit(ctx, py("%s", chartJob))
	if err != nil {
		t.Fatal(err)
	}
	hit, err := e.api.Wait(ctx, again.ID)
	if err != nil || !hit.CacheHit {
		t.Fatalf("resubmission: %v, cache hit %v", err, hit.CacheHit)
	}
	requireChartOutputs(t, hit.Outputs)

	code, _ := json.Marshal(chartJob)
	call := func(body string) map[string]any {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.apiURL+"/v1/tool-calls", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
			t.Fatalf("tool call: %d %s", resp.StatusCode, b)
		}
		return m
	}
	anth := call(`{"type":"tool_use","id":"toolu_1","name":"run_python","input":{"code":` + string(code) + `}}`)
	content, _ := anth["content"].([]any)
	if len(content) != 2 {
		t.Fatalf("anthropic tool result: %+v", anth)
	}
	text := content[0].(map[string]any)["text"].(string)
	img := content[1].(map[string]any)
	src, _ := img["source"].(map[string]any)
	if img["type"] != "image" || src["media_type"] != "image/png" || !strings.Contains(text, "'one'\n") || !strings.Contains(text, "   a\n0  1\n1  2\n") {
		t.Errorf("anthropic tool result: text %q, image block %v", text, img["type"])
	}
	requirePNG(t, "anthropic image block", src["data"])
	dropID := func(s string) string { head, _, _ := strings.Cut(s, "job_id: "); return head } // a cache hit has an id of its own
	args, _ := json.Marshal(`{"code":` + string(code) + `}`)

	// OpenAI Responses: the same text as an input_text, the figure as an
	// input_image data URL.
	resp := call(`{"type":"function_call","id":"fc_1","call_id":"call_r","name":"run_python","arguments":` + string(args) + `}`)
	output, _ := resp["output"].([]any)
	if resp["type"] != "function_call_output" || resp["call_id"] != "call_r" || len(output) != 2 {
		t.Fatalf("responses function_call_output: %+v", resp)
	}
	rtext, _ := output[0].(map[string]any)["text"].(string)
	if output[0].(map[string]any)["type"] != "input_text" || dropID(rtext) != dropID(text) {
		t.Errorf("responses text differs from anthropic's:\n%s\n---\n%s", rtext, text)
	}
	rimg, _ := output[1].(map[string]any)
	dataURL, _ := rimg["image_url"].(string)
	data, ok := strings.CutPrefix(dataURL, "data:image/png;base64,")
	if rimg["type"] != "input_image" || !ok {
		t.Fatalf("responses image part: %.80v", rimg)
	}
	requirePNG(t, "responses input_image", data)

	// Chat Completions: the same text, then where the image is (its tool
	// message takes text only).
	oai := call(`{"id":"call_1","type":"function","function":{"name":"run_python","arguments":` + string(args) + `}}`)
	oaiText, _ := oai["content"].(string)
	body, note, _ := strings.Cut(oaiText, "images_not_shown: ")
	if dropID(body) != dropID(text) {
		t.Errorf("openai tool message text differs from anthropic's:\n%v\n---\n%s", oai["content"], text)
	}
	_, jobID, _ := strings.Cut(body, "job_id: ")
	jobID = strings.TrimSpace(jobID)
	if want := `- output-4 (image/png): outputs[3].data["image/png"] (base64) of GET /v1/jobs/` + jobID + "\n"; !strings.HasSuffix(note, want) {
		t.Errorf("the chat completions text does not say where the image is (want %q):\n%s", want, oaiText)
	}
	// And it is there.
	named, err := e.api.Get(ctx, jobID, 0)
	if err != nil {
		t.Fatal(err)
	}
	requireChartOutputs(t, named.Outputs)
}

// requirePNG fails t unless data is base64 of a PNG that decodes.
func requirePNG(t *testing.T, what string, data any) {
	t.Helper()
	s, _ := data.(string)
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Fatalf("%s does not decode as a PNG: %v", what, err)
	}
}
