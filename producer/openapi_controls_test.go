package producer

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// The document lists every kind a result's redactions can count.
func TestOpenAPIRedactionKinds(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Kinds []string `json:"x-kiln-kinds"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Components.Schemas["Result"].Properties["redactions"].Kinds
	want := redact.Kinds()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Result.redactions kinds: the document says %v, the detectors %v", got, want)
	}
}

// The document lists every audit record kind.
func TestOpenAPIAuditKinds(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `json:"enum"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range job.AuditKinds() {
		want = append(want, string(k))
	}
	if got := doc.Components.Schemas["AuditRecord"].Properties["kind"].Enum; !slices.Equal(got, want) {
		t.Fatalf("audit kinds: the document says %v, job/ %v", got, want)
	}
	var params struct {
		Paths struct {
			Audit struct {
				Get struct {
					Parameters []struct {
						Name   string `json:"name"`
						Schema struct {
							Enum []string `json:"enum"`
						} `json:"schema"`
					} `json:"parameters"`
				} `json:"get"`
			} `json:"/v1/audit"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &params); err != nil {
		t.Fatal(err)
	}
	for _, p := range params.Paths.Audit.Get.Parameters {
		if p.Name == "kind" && !slices.Equal(p.Schema.Enum, want) {
			t.Fatalf("GET /v1/audit?kind=: the document says %v, job/ %v", p.Schema.Enum, want)
		}
	}
}
