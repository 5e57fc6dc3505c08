package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
)

// TestOpenAPIAgreesWithServer checks that /openapi.json is a valid OpenAPI
// document and states the limits and enums the server enforces, taken from
// the constants the server uses. (internal/e2e validates real answers of
// every route against it.)
func TestOpenAPIAgreesWithServer(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(openAPI, &raw); err != nil {
		t.Fatal(err)
	}
	at := func(path ...string) any {
		var v any = raw
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("openapi.json has no %v", path)
			}
			v = m[p]
		}
		return v
	}
	schema := func(path ...string) any { return at(append([]string{"components", "schemas"}, path...)...) }
	num := func(v any) int64 {
		f, ok := v.(float64)
		if !ok {
			t.Fatalf("%v is not a number", v)
		}
		return int64(f)
	}
	strs := func(v any) []string {
		var out []string
		for _, x := range v.([]any) {
			out = append(out, x.(string))
		}
		return out
	}
	eq := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the document says %v, the server %v", what, got, want)
		}
	}

	spec := func(p ...string) any { return schema(append([]string{"Spec", "properties"}, p...)...) }
	eq("code bytes", num(spec("code", "x-kiln-max-bytes")), int64(job.MaxCodeBytes))
	if spec("code", "maxLength") != nil {
		t.Error("code has maxLength: JSON Schema counts characters, the server bytes")
	}
	eq("stdin bytes", num(spec("stdin", "x-kiln-max-bytes")), int64(job.MaxStdinBytes))
	eq("args", num(spec("args", "maxItems")), int64(job.MaxArgs))
	eq("args bytes", num(spec("args", "x-kiln-max-total-bytes")), int64(job.MaxArgBytes))
	eq("env vars", num(spec("env", "maxProperties")), int64(job.MaxEnvVars))
	eq("env bytes", num(spec("env", "x-kiln-max-total-bytes")), int64(job.MaxEnvBytes))
	eq("reserved env", strs(spec("env", "x-kiln-reserved-names")), job.ReservedEnv)
	eq("reserved env in propertyNames", strs(spec("env", "propertyNames", "not", "anyOf").([]any)[0].(map[string]any)["enum"]), job.ReservedEnv)
	eq("files", num(spec("files", "maxItems")), int64(job.MaxFiles))
	eq("files bytes", num(spec("files", "x-kiln-max-total-bytes")), int64(job.MaxFilesBytes))
	eq("file name bytes", num(schema("File", "properties", "name", "x-kiln-max-bytes")), int64(job.MaxFileNameLen))
	for _, enc := range strs(schema("File", "properties", "encoding", "enum")) {
		if _, err := (job.File{Name: "f", Content: "", Encoding: enc}).Bytes(); err != nil {
			t.Errorf("encoding %q is documented but refused: %v", enc, err)
		}
	}
	for _, enc := range []string{"hex", "base32", "latin1"} {
		if _, err := (job.File{Name: "f", Encoding: enc}).Bytes(); err == nil {
			t.Errorf("encoding %q is accepted but not documented", enc)
		}
	}
	eq("batch size", num(at("paths", "/v1/jobs/batch", "post", "requestBody", "content", "application/json", "schema", "properties", "jobs", "maxItems")), int64(MaxBatchDefault))
	eq("Idempotency-Key", num(at("paths", "/v1/jobs", "post", "parameters").([]any)[1].(map[string]any)["schema"].(map[string]any)["maxLength"]), int64(maxIdempotencyKey))

	var pending, terminal []string
	for _, s := range job.Statuses {
		if s.Terminal() {
			terminal = append(terminal, string(s))
		} else {
			pending = append(pending, string(s))
		}
	}
	eq("pending statuses", strs(schema("PendingStatus", "enum")), pending)
	eq("terminal statuses", strs(schema("TerminalStatus", "enum")), terminal)
	eq("all statuses", strs(schema("Status", "enum")), append(pending, terminal...))
	mapping := schema("Job", "discriminator", "mapping").(map[string]any)
	for _, s := range job.Statuses {
		want := "#/components/schemas/Accepted"
		if s.Terminal() {
			want = "#/components/schemas/Result"
		}
		eq("discriminator "+string(s), mapping[string(s)], want)
	}
	categories := []job.Category{job.CategorySyntaxError, job.CategoryRuntimeError, job.CategoryTimeout, job.CategoryMemoryLimit,
		job.CategoryOutputLimit, job.CategoryForbidden, job.CategoryInvalidRequest, job.CategoryCanceled, job.CategoryInternal, job.CategoryQuota}
	eq("error categories", fmt.Sprint(strs(schema("Failure", "properties", "category", "enum"))), fmt.Sprint(categories))
	eq("problem types", strs(schema("Problem", "properties", "type", "enum")), []string{string(job.ProblemMalformedJSON), string(job.ProblemUnknownField),
		string(job.ProblemUnsupportedMediaType), string(job.ProblemBodyTooLarge), string(job.ProblemInvalidField), string(job.ProblemBatchTooLarge), string(job.ProblemInvalidParameter), string(job.ProblemInvalidID), string(job.ProblemNotFound),
		string(job.ProblemMethodNotAllowed), string(job.ProblemIdempotencyKeyReused), string(job.ProblemUnauthorized), string(job.ProblemQueueFull), string(job.ProblemUnavailable), string(job.ProblemInternal),
		string(job.ProblemDuplicateField), string(job.ProblemFieldNameCase), string(job.ProblemBusy), job.ProblemQuotaPrefix + "max_queued",
		job.ProblemQuotaPrefix + "submissions_per_second", job.ProblemQuotaPrefix + "cpu_seconds_per_day", string(job.ProblemResponseTooLarge), string(job.ProblemBudgetExhausted), string(job.ProblemReplayUnavailable),
		string(job.ProblemSessionEnded), job.ProblemQuotaPrefix + "sessions", job.QuotaProblemType(job.QuotaSessionMemory), string(job.ProblemEgressNotAllowed), string(job.ProblemFileConflict), string(job.ProblemStdinClosed)})
	eq("metadata keys", num(schema("Metadata", "maxProperties")), int64(job.MaxMetadataKeys))
	eq("metadata value bytes", num(schema("Metadata", "additionalProperties", "x-kiln-max-bytes")), int64(job.MaxMetadataValueBytes))
	eq("metadata key pattern", schema("Metadata", "propertyNames", "pattern"), fmt.Sprintf("^[A-Za-z0-9_.:-]{1,%d}$", job.MaxMetadataKeyBytes))
	eq("listing page", num(schema("JobPage", "properties", "jobs", "maxItems")), int64(job.ListPageMax))
	for _, p := range at("paths", "/v1/jobs", "get", "parameters").([]any) {
		if p := p.(map[string]any); p["name"] == "limit" {
			eq("listing limit", num(p["schema"].(map[string]any)["maximum"]), int64(job.ListPageMax))
		}
	}
	eq("network allow entries", num(schema("Network", "properties", "allow", "maxItems")), int64(job.MaxNetworkAllow))
	eq("egress records", num(schema("Egress", "properties", "records", "maxItems")), int64(job.MaxEgressRecords))
	var formats []string
	for _, f := range tooluse.Formats {
		formats = append(formats, string(f))
	}
	eq("tool formats", strs(schema("ToolFormat", "enum")), formats)
	eq("inline image types", strs(schema("AnthropicToolResult", "properties", "content", "items", "oneOf").([]any)[1].(map[string]any)["properties"].(map[string]any)["source"].(map[string]any)["properties"].(map[string]any)["media_type"].(map[string]any)["enum"]), tooluse.InlineImageTypes)
}

// A request property with a "default" is made required by generators that
// treat defaults as always present (openapi-typescript's defaults), so a
// submit body with only code would not compile: defaults are stated in the
// descriptions of the request schemas instead. Every schema a request body
// or a parameter reaches, through any $ref, is checked.
func TestOpenAPIRequestSchemasHaveNoDefaults(t *testing.T) {
	var raw map[string]any
	if err := json.Unmarshal(openAPI, &raw); err != nil {
		t.Fatal(err)
	}
	schemas := raw["components"].(map[string]any)["schemas"].(map[string]any)
	seen := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if _, ok := x["default"]; ok {
				t.Errorf("%s has a default", path)
			}
			if ref, ok := x["$ref"].(string); ok {
				name := strings.TrimPrefix(ref, "#/components/schemas/")
				if !seen[name] && schemas[name] != nil {
					seen[name] = true
					walk(name, schemas[name])
				}
			}
			for k, c := range x {
				walk(path+"/"+k, c)
			}
		case []any:
			for i, c := range x {
				walk(fmt.Sprintf("%s/%d", path, i), c)
			}
		}
	}
	for path, item := range raw["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			o, ok := op.(map[string]any)
			if !ok {
				continue
			}
			walk(method+" "+path+" requestBody", o["requestBody"])
			walk(method+" "+path+" parameters", o["parameters"])
		}
	}
	for _, name := range []string{"Spec", "SessionSpec", "SessionCall", "BudgetRequest"} {
		if !seen[name] {
			t.Errorf("no request reaches %s: the walk missed it", name)
		}
	}
	spec := schemas["Spec"].(map[string]any)
	if req, _ := spec["required"].([]any); len(req) != 1 || req[0] != "code" {
		t.Errorf("Spec requires %v; want only code", spec["required"])
	}
}
