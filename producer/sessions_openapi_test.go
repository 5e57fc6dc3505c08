package producer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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
		"/v1/sessions/{id}/files":        {"get", "post"},
		"/v1/sessions/{id}/files/{path}": {"get", "put", "delete"},
	} {
		for _, m := range methods {
			if doc.Paths[path][m] == nil {
				t.Errorf("openapi.json lacks %s %s", m, path)
			}
		}
	}
	// Defaults are stated in the descriptions, never as "default" (see
	// TestOpenAPIRequestSchemasHaveNoDefaults).
	spec := doc.Components.Schemas["SessionSpec"].Properties
	for field, want := range map[string]string{
		"idle_timeout_s": fmt.Sprintf("Absent: %d.", int64(job.SessionIdleTimeoutDefault.Seconds())),
		"max_lifetime_s": fmt.Sprintf("Absent: %d.", int64(job.SessionMaxLifetimeDefault.Seconds())),
		"restore":        "Absent: " + job.RestoreFiles + ".",
	} {
		if d, _ := spec[field]["description"].(string); !strings.HasSuffix(d, want) {
			t.Errorf("SessionSpec.%s: the description %q does not end with the server's default %q", field, d, want)
		}
	}
	if got := spec["max_lifetime_s"]["maximum"]; got != float64(job.SessionMaxLifetimeMax.Seconds()) {
		t.Errorf("max_lifetime_s maximum: the document says %v", got)
	}
	// The files API's bounds are the server's.
	list := doc.Components.Schemas["SessionFileList"].Properties["entries"]["maxItems"]
	op := doc.Components.Schemas["SessionFileOp"].Properties
	if list != float64(job.SessionFileListMax) || op["path"]["maxLength"] != float64(job.SessionFilePathMax) || op["to"]["maxLength"] != float64(job.SessionFilePathMax) {
		t.Errorf("files bounds: the document says a page of %v entries, paths of %v and %v bytes", list, op["path"]["maxLength"], op["to"]["maxLength"])
	}
	// The wire codes of a file operation's refusal are the worker's.
	var codes struct {
		Components struct {
			Schemas struct {
				SessionFileError struct {
					Properties struct {
						Code struct {
							Enum []string `json:"enum"`
						} `json:"code"`
					} `json:"properties"`
				} `json:"SessionFileError"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &codes); err != nil {
		t.Fatal(err)
	}
	got := codes.Components.Schemas.SessionFileError.Properties.Code.Enum
	for code := range fileRefusals {
		if !slices.Contains(got, code) {
			t.Errorf("SessionFileError.code lacks %s", code)
		}
	}
	if len(got) != len(fileRefusals) {
		t.Errorf("SessionFileError.code lists %v; the server maps %d codes", got, len(fileRefusals))
	}
	var cr struct {
		Components struct {
			Schemas map[string]struct {
				Required   []string                   `json:"required"`
				Properties map[string]json.RawMessage `json:"properties"`
				Additional json.RawMessage            `json:"additionalProperties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &cr); err != nil {
		t.Fatal(err)
	}
	// A call's result is a job's result and more: every property of
	// Result, the same, and the call's own (Result admits no other
	// properties, so CallResult cannot be an allOf of it). A job's
	// metadata and callback are not a call's: the call's session carries
	// its own metadata, and a call names no callback.
	res, call := cr.Components.Schemas["Result"], cr.Components.Schemas["CallResult"]
	for name, def := range res.Properties {
		if name == "metadata" || name == "callback" {
			continue
		}
		if !bytes.Equal(call.Properties[name], def) {
			t.Errorf("CallResult's %s differs from Result's", name)
		}
	}
	if !slices.Equal(call.Required, res.Required) || string(call.Additional) != "false" {
		t.Errorf("CallResult requires %v (Result: %v), additionalProperties %v", call.Required, res.Required, call.Additional)
	}
	for _, f := range []string{"seq", "incarnation", "state_restored", "session_note"} {
		if call.Properties[f] == nil {
			t.Errorf("CallResult lacks %s", f)
		}
	}
	// A pending call is its own schema, never a zero-valued result.
	if call.Properties["pending"] != nil {
		t.Error("CallResult has pending: a call not ended is answered as CallPending")
	}
	pending := cr.Components.Schemas["CallPending"]
	if !slices.Equal(pending.Required, []string{"seq", "status", "pending", "links"}) {
		t.Errorf("CallPending requires %v", pending.Required)
	}
}
