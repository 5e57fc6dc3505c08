package producer

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// Every session endpoint the server routes is in /openapi.json with its
// methods, and the documented bounds are the server's.
func TestOpenAPIDocumentsSessions(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths      map[string]map[string]any `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for path, methods := range map[string][]string{
		"/v1/sessions":                   {"post", "get"},
		"/v1/sessions/{id}":              {"get", "delete"},
		"/v1/sessions/{id}/exec":         {"post"},
		"/v1/sessions/{id}/calls/{seq}":  {"get"},
		"/v1/sessions/{id}/files/{path}": {"get", "put"},
	} {
		for _, m := range methods {
			if doc.Paths[path][m] == nil {
				t.Errorf("openapi.json lacks %s %s", m, path)
			}
		}
	}
	spec := doc.Components.Schemas["SessionSpec"].Properties
	if got := spec["idle_timeout_s"]["default"]; got != float64(job.SessionIdleTimeoutDefault.Seconds()) {
		t.Errorf("idle_timeout_s default: the document says %v", got)
	}
	if got := spec["max_lifetime_s"]["default"]; got != float64(job.SessionMaxLifetimeDefault.Seconds()) {
		t.Errorf("max_lifetime_s default: the document says %v", got)
	}
	if got := spec["max_lifetime_s"]["maximum"]; got != float64(job.SessionMaxLifetimeMax.Seconds()) {
		t.Errorf("max_lifetime_s maximum: the document says %v", got)
	}
	var cr struct {
		Components struct {
			Schemas map[string]struct {
				Required   []string                   `json:"required"`
				Properties map[string]json.RawMessage `json:"properties"`
				Additional *bool                      `json:"additionalProperties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &cr); err != nil {
		t.Fatal(err)
	}
	// A call's result is a job's result and more: every property of
	// Result, the same, and the call's own (Result admits no other
	// properties, so CallResult cannot be an allOf of it).
	res, call := cr.Components.Schemas["Result"], cr.Components.Schemas["CallResult"]
	for name, def := range res.Properties {
		if !bytes.Equal(call.Properties[name], def) {
			t.Errorf("CallResult's %s differs from Result's", name)
		}
	}
	if !slices.Equal(call.Required, res.Required) || call.Additional == nil || *call.Additional {
		t.Errorf("CallResult requires %v (Result: %v), additionalProperties %v", call.Required, res.Required, call.Additional)
	}
	for _, f := range []string{"seq", "incarnation", "state_restored", "session_note", "pending"} {
		if call.Properties[f] == nil {
			t.Errorf("CallResult lacks %s", f)
		}
	}
}
