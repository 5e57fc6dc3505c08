package producer

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// The problem types /openapi.json documents are exactly those job/ declares.
func TestProblemTypesMatchTheWireContract(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas struct {
				Problem struct {
					Properties struct {
						Type struct {
							Enum []string `json:"enum"`
						} `json:"type"`
					} `json:"properties"`
				} `json:"Problem"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, typ := range doc.Components.Schemas.Problem.Properties.Type.Enum {
		if !strings.HasPrefix(typ, job.ProblemQuotaPrefix) {
			documented = append(documented, typ)
		}
	}
	var declared []string
	for _, typ := range job.ProblemTypes() {
		declared = append(declared, string(typ))
	}
	slices.Sort(documented)
	slices.Sort(declared)
	if !slices.Equal(documented, declared) {
		t.Fatalf("openapi.json documents %v;\njob/ declares %v", documented, declared)
	}
}
