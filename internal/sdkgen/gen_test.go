package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/internal/testenv"
)

// root is the repository's root, relative to this package.
const root = "../.."

func readDoc(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, documentFile))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The SDKs' generated files are what sdkgen writes from the document now:
// a change to openapi.json without `make sdk` fails here.
func TestGeneratedFilesMatchTheDocument(t *testing.T) {
	files, err := generate(readDoc(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Unavailable(t, "node is not in PATH: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "sdk", "typescript", "node_modules", "openapi-typescript")); err != nil {
		testenv.Unavailable(t, "sdk/typescript's devDependencies are not installed: run `npm ci` in sdk/typescript (%v)", err)
	}
	ts, err := typeScript(root)
	if err != nil {
		t.Fatal(err)
	}
	files[openAPITypes] = ts
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Errorf("%s: %v (run make sdk)", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what internal/sdkgen writes from %s: run make sdk and commit the result", name, documentFile)
		}
	}
}

// The check can fail: a document whose problem types or enums change makes
// other files, and a problem type without an exception class is refused.
func TestGenerationFollowsTheDocument(t *testing.T) {
	t.Parallel()
	raw := readDoc(t)
	base, err := generate(raw)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	problem := schemas["Problem"].(map[string]any)
	typ := problem["properties"].(map[string]any)["type"].(map[string]any)
	typ["enum"] = append(typ["enum"].([]any), "urn:kiln:problem:something-new")
	mutated, _ := json.Marshal(doc)
	if _, err := generate(mutated); err == nil || !strings.Contains(err.Error(), "something-new has no class") {
		t.Errorf("a problem type without a class: %v", err)
	}
	problem["x-kiln-sdk-errors"].(map[string]any)["by-type"].(map[string]any)["urn:kiln:problem:something-new"] = "InvalidRequest"
	mutated, _ = json.Marshal(doc)
	files, err := generate(mutated)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{pythonFile, jsFile} {
		if bytes.Equal(files[name], base[name]) || !bytes.Contains(files[name], []byte(`"something-new": "InvalidRequest"`)) {
			t.Errorf("%s does not follow a new problem type", name)
		}
	}
	again, err := generate(raw)
	if err != nil {
		t.Fatal(err)
	}
	for name := range base {
		if !bytes.Equal(again[name], base[name]) {
			t.Errorf("%s: two runs differ", name)
		}
	}
}

// The TypeScript SDK's declarations, made of the generated types, compile
// with the example that uses them (test/types.check.ts) under strict mode.
func TestTypeScriptDeclarationsCompile(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Unavailable(t, "node is not in PATH: %v", err)
	}
	dir := filepath.Join(root, "sdk", "typescript")
	tsc := filepath.Join(dir, "node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		testenv.Unavailable(t, "sdk/typescript's devDependencies are not installed: run `npm ci` in sdk/typescript (%v)", err)
	}
	cmd := exec.CommandContext(t.Context(), node, tsc, "-p", "tsconfig.json")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc -p sdk/typescript/tsconfig.json: %v\n%s", err, out)
	}
}
