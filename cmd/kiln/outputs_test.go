package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// An output's JSON value is saved as the JSON it is; one flattened for its
// depth (a string holding its JSON text) is saved as that text, not as a
// quoted string.
func TestOutputValueOfAFlattenedJSONIsItsText(t *testing.T) {
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	flat, _ := json.Marshal(deep)
	o := job.Output{Type: job.OutputDisplay, Data: map[string]json.RawMessage{
		job.MIMEText: json.RawMessage(`"x"`), job.MIMEJSON: flat, "application/vnd.x+json": json.RawMessage(`{"a": 1}`)},
		Flattened: []string{job.MIMEJSON}}
	b, err := outputValue(t.Context(), nil, "id", o, job.MIMEJSON)
	if err != nil || string(b) != deep {
		t.Fatalf("the flattened value: %.40q %v; want its JSON text", b, err)
	}
	b, err = outputValue(t.Context(), nil, "id", o, "application/vnd.x+json")
	if err != nil || string(b) != "{\"a\": 1}\n" {
		t.Fatalf("a JSON value: %q %v", b, err)
	}
}
