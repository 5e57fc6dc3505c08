package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The files written, relative to the repository root.
const (
	pythonFile   = "sdk/python/kiln/_schema.py"
	jsFile       = "sdk/typescript/src/schema.js"
	jsTypesFile  = "sdk/typescript/src/schema.d.ts"
	openAPITypes = "sdk/typescript/src/openapi.d.ts"
	documentFile = "producer/openapi.json"
)

const header = "Generated from producer/openapi.json by internal/sdkgen (make sdk); do not edit."

// schema is the part of a JSON Schema the generator reads. Keys keep the
// document's order where it matters (properties), via propOrder.
type schema struct {
	Ref        string             `json:"$ref"`
	Type       any                `json:"type"`
	Enum       []any              `json:"enum"`
	Const      any                `json:"const"`
	Properties map[string]*schema `json:"properties"`
	Required   []string           `json:"required"`
	Items      *schema            `json:"items"`
	Additional json.RawMessage    `json:"additionalProperties"`
	OneOf      []*schema          `json:"oneOf"`
	AnyOf      []*schema          `json:"anyOf"`
	AllOf      []*schema          `json:"allOf"`
	Desc       string             `json:"description"`

	propOrder []string
}

// document is what the generator reads of openapi.json.
type document struct {
	Components struct {
		Schemas map[string]*schema `json:"schemas"`
	} `json:"components"`
	schemaOrder []string
	// errors is the Problem schema's x-kiln-sdk-errors.
	errors struct {
		ByType   map[string]string `json:"by-type"`
		ByStatus map[string]string `json:"by-status"`
	}
}

// parse reads doc, keeping the order of components and of properties.
func parse(raw []byte) (*document, error) {
	var d document
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("parse %s: %w", documentFile, err)
	}
	var ordered struct {
		Components struct {
			Schemas orderedMap `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &ordered); err != nil {
		return nil, fmt.Errorf("parse %s: %w", documentFile, err)
	}
	d.schemaOrder = ordered.Components.Schemas.keys
	for i, name := range ordered.Components.Schemas.keys {
		if err := setPropOrder(d.Components.Schemas[name], ordered.Components.Schemas.vals[i]); err != nil {
			return nil, fmt.Errorf("schema %s: %w", name, err)
		}
	}
	if d.Components.Schemas["Problem"] == nil {
		return nil, fmt.Errorf("%s has no Problem schema", documentFile)
	}
	var problem struct {
		Errors json.RawMessage `json:"x-kiln-sdk-errors"`
	}
	var withExt struct {
		Components struct {
			Schemas struct {
				Problem json.RawMessage `json:"Problem"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &withExt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(withExt.Components.Schemas.Problem, &problem); err != nil {
		return nil, err
	}
	if len(problem.Errors) == 0 {
		return nil, fmt.Errorf("%s: Problem has no x-kiln-sdk-errors", documentFile)
	}
	if err := json.Unmarshal(problem.Errors, &d.errors); err != nil {
		return nil, fmt.Errorf("x-kiln-sdk-errors: %w", err)
	}
	return &d, nil
}

// orderedMap is a JSON object's keys in order, with their raw values.
type orderedMap struct {
	keys []string
	vals []json.RawMessage
}

func (m *orderedMap) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		m.keys = append(m.keys, t.(string))
		m.vals = append(m.vals, v)
	}
	return nil
}

// setPropOrder records s's property order from its raw JSON, recursively.
func setPropOrder(s *schema, raw json.RawMessage) error {
	if s == nil {
		return nil
	}
	var r struct {
		Properties orderedMap      `json:"properties"`
		Items      json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	s.propOrder = r.Properties.keys
	for i, k := range r.Properties.keys {
		if err := setPropOrder(s.Properties[k], r.Properties.vals[i]); err != nil {
			return err
		}
	}
	if s.Items != nil && len(r.Items) > 0 {
		return setPropOrder(s.Items, r.Items)
	}
	return nil
}

// enumStrings is s's enum as strings.
func enumStrings(s *schema) []string {
	var out []string
	for _, v := range s.Enum {
		if str, ok := v.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// errorClasses checks the error tables: every problem type of the
// document has a class, and no class names a type the document lacks.
func (d *document) errorClasses() (types []string, err error) {
	p := d.Components.Schemas["Problem"]
	types = enumStrings(p.Properties["type"])
	for _, t := range types {
		if d.errors.ByType[t] == "" {
			return nil, fmt.Errorf("x-kiln-sdk-errors: problem type %s has no class", t)
		}
	}
	for t := range d.errors.ByType {
		if !slices.Contains(types, t) {
			return nil, fmt.Errorf("x-kiln-sdk-errors: %s is not a problem type of the document", t)
		}
	}
	return types, nil
}

// constants are the values both SDKs get as constants.
type constants struct {
	Statuses, Pending, Terminal, Categories, ProblemTypes, ToolFormats []string
	ByType                                                             [][2]string // problem type suffix → class
	ByStatus                                                           [][2]string // status → class
	Classes                                                            []string    // every class named
}

const problemPrefix = "urn:kiln:problem:"

func (d *document) constants() (constants, error) {
	var c constants
	s := d.Components.Schemas
	c.Statuses = enumStrings(s["Status"])
	c.Pending = enumStrings(s["PendingStatus"])
	c.Terminal = enumStrings(s["TerminalStatus"])
	c.Categories = enumStrings(s["Failure"].Properties["category"])
	c.ToolFormats = enumStrings(s["ToolFormat"])
	types, err := d.errorClasses()
	if err != nil {
		return c, err
	}
	c.ProblemTypes = types
	classes := map[string]bool{}
	for _, t := range types {
		cls := d.errors.ByType[t]
		c.ByType = append(c.ByType, [2]string{strings.TrimPrefix(t, problemPrefix), cls})
		classes[cls] = true
	}
	var statuses []int
	for k := range d.errors.ByStatus {
		n, err := strconv.Atoi(k)
		if err != nil {
			return c, fmt.Errorf("x-kiln-sdk-errors by-status: %q is not a status", k)
		}
		statuses = append(statuses, n)
	}
	sort.Ints(statuses)
	for _, n := range statuses {
		cls := d.errors.ByStatus[strconv.Itoa(n)]
		c.ByStatus = append(c.ByStatus, [2]string{strconv.Itoa(n), cls})
		classes[cls] = true
	}
	for cls := range classes {
		c.Classes = append(c.Classes, cls)
	}
	sort.Strings(c.Classes)
	if len(c.Statuses) == 0 || len(c.Terminal) == 0 || len(c.Categories) == 0 {
		return c, fmt.Errorf("%s lacks the Status, TerminalStatus or Failure.category enums", documentFile)
	}
	return c, nil
}

// generate returns the files made without Node: the Python module and the
// JavaScript constants with their declarations.
func generate(raw []byte) (map[string][]byte, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	c, err := d.constants()
	if err != nil {
		return nil, err
	}
	py, err := python(d, c)
	if err != nil {
		return nil, err
	}
	js, dts := javascript(c)
	return map[string][]byte{pythonFile: py, jsFile: js, jsTypesFile: dts}, nil
}

// wrap splits text into lines of at most width (words are not cut).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// typeScript runs openapi-typescript (sdk/typescript's devDependency, as
// its lock file pins it) with its default settings over the document and
// returns the declarations it writes.
func typeScript(root string) ([]byte, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("openapi-typescript needs node: %w", err)
	}
	cli := filepath.Join(root, "sdk", "typescript", "node_modules", "openapi-typescript", "bin", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		return nil, fmt.Errorf("openapi-typescript is not installed: run `npm ci` in sdk/typescript (%w)", err)
	}
	dir, err := os.MkdirTemp("", "sdkgen-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "openapi.d.ts")
	cmd := exec.Command(node, cli, filepath.Join(root, documentFile), "--output", out)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("openapi-typescript: %w\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	return append([]byte("// "+header+"\n// openapi-typescript with its default settings; the SDK's types (index.d.ts) are made of these.\n"), b...), nil
}
