package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// The channel's parser keeps well-formed outputs, counts the rest, and
// stops at its bound.
func TestReadOutputStream(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"type":"display_data","data":{"text/plain":"1"}}`,
		`not json`,
		`{"type":"display_data","data":{"text/html":"<b>no text/plain</b>"}}`,
		`{"type":"bogus","data":{"text/plain":"x"}}`,
		`{"type":"execute_result","data":{"text/plain":"2","application/json":{"a":1}}}`,
		`{"exception":{"type":"ValueError","message":"bad","line":3}}`,
		`{"dropped":5}`,
	}, "\n") + "\n"
	st := readOutputStream(strings.NewReader(in), true)
	if len(st.outputs) != 2 || st.outputs[1].Text(job.MIMEText) != "2" || st.dropped != 8 || st.exception == nil || st.exception.Line != 3 {
		t.Fatalf("got %+v", st)
	}
	big := `{"type":"display_data","data":{"text/plain":"` + strings.Repeat("a", job.MaxOutputsBytes) + `"}}` + "\n" +
		`{"type":"display_data","data":{"text/plain":"after"}}` + "\n"
	st = readOutputStream(strings.NewReader(big), true)
	if len(st.outputs) != 0 || !st.truncated || st.dropped != 1 {
		t.Fatalf("over the bound: %d outputs, truncated %v, dropped %d", len(st.outputs), st.truncated, st.dropped)
	}
}

// Values over the inline bounds go to the store; with no store they are
// dropped and the cut is reported, text/plain always staying.
func TestPlaceOutputs(t *testing.T) {
	t.Parallel()
	long := json.RawMessage(`"` + strings.Repeat("z", job.MaxOutputValueInline) + `"`)
	mk := func() outputStream {
		return outputStream{outputs: []job.Output{{Type: job.OutputDisplay, Data: map[string]json.RawMessage{
			job.MIMEText: long, job.MIMEHTML: long, job.MIMEMarkdown: json.RawMessage(`"ok"`)}}}}
	}
	mem := &memStore{objs: map[string][]byte{}}
	var res job.Result
	res.Artifacts = []job.Artifact{{Name: job.OutputArtifactDir + "/1.txt"}} // the program's own file of that name
	placeOutputs(t.Context(), mem.put, &res, mk())
	o := res.Outputs[0]
	if o.Artifacts[job.MIMEText] != job.OutputArtifactDir+"/1.txt.2" || o.Artifacts[job.MIMEHTML] != job.OutputArtifactDir+"/1.html" ||
		o.Text(job.MIMEMarkdown) != "ok" || o.Has(job.MIMEHTML) || len(o.Text(job.MIMEText)) > 4100 || res.OutputsTruncated {
		t.Fatalf("with a store: %+v (truncated %v)", o, res.OutputsTruncated)
	}
	if len(res.Artifacts) != 3 || len(mem.objs) != 1 { // the same bytes twice: one object
		t.Fatalf("artifacts %+v, %d objects", res.Artifacts, len(mem.objs))
	}
	res = job.Result{}
	placeOutputs(t.Context(), nil, &res, mk())
	o = res.Outputs[0]
	if !res.OutputsTruncated || o.Has(job.MIMEHTML) || !o.Has(job.MIMEText) || len(o.Artifacts) != 0 {
		t.Fatalf("without a store: %+v (truncated %v)", o, res.OutputsTruncated)
	}
}
