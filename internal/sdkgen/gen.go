package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

func pyTuple(vals []string) string {
	var q []string
	for _, v := range vals {
		q = append(q, strconv.Quote(v))
	}
	if len(q) == 1 {
		return "(" + q[0] + ",)"
	}
	return "(" + strings.Join(q, ", ") + ")"
}

func pyLiteral(vals []string) string {
	var q []string
	for _, v := range vals {
		q = append(q, strconv.Quote(v))
	}
	return "Literal[" + strings.Join(q, ", ") + "]"
}

// pyIdent is a valid Python identifier: schema names are.
var pyIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// pyType is s's Python type annotation (inside quotes where it names a
// schema, so order does not matter).
func pyType(s *schema) string {
	switch {
	case s == nil:
		return "Any"
	case s.Ref != "":
		return strconv.Quote(strings.TrimPrefix(s.Ref, "#/components/schemas/"))
	case s.Const != nil:
		b, _ := json.Marshal(s.Const)
		if v, ok := s.Const.(bool); ok {
			if v {
				return "Literal[True]"
			}
			return "Literal[False]"
		}
		return "Literal[" + string(b) + "]"
	case len(s.Enum) > 0 && len(enumStrings(s)) == len(s.Enum):
		return pyLiteral(enumStrings(s))
	case len(s.OneOf) > 0 || len(s.AnyOf) > 0:
		var parts []string
		for _, o := range append(append([]*schema{}, s.OneOf...), s.AnyOf...) {
			if t := pyType(o); !slices.Contains(parts, t) {
				parts = append(parts, t)
			}
		}
		if len(parts) == 1 {
			return parts[0]
		}
		return "Union[" + strings.Join(parts, ", ") + "]"
	}
	switch typeName(s) {
	case "string":
		return "str"
	case "integer":
		return "int"
	case "number":
		return "float"
	case "boolean":
		return "bool"
	case "array":
		return "List[" + pyType(s.Items) + "]"
	case "object":
		if len(s.Properties) == 0 {
			var add schema
			if json.Unmarshal(s.Additional, &add) == nil && (add.Type != nil || add.Ref != "") {
				return "Dict[str, " + pyType(&add) + "]"
			}
			return "Dict[str, Any]"
		}
		return "Dict[str, Any]"
	}
	return "Any"
}

// typeName is s's type when it is one name ("" for a list of types).
func typeName(s *schema) string {
	if t, ok := s.Type.(string); ok {
		return t
	}
	return ""
}

func python(d *document, c constants) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "\"\"\"The API's wire types and tables, from its OpenAPI document.\n\n%s\n\nEach object schema of the document is a TypedDict of the same name (keys as the\nJSON has them; REQUIRED lists the keys an answer always holds); enums are Literal\ntypes and tuples; ERROR_CLASS_BY_TYPE and ERROR_CLASS_BY_STATUS name the exception\nclass (kiln.errors) of each problem type and HTTP status.\n\"\"\"\n", header)
	b.WriteString("from __future__ import annotations\n\nfrom typing import Any, Dict, List, Literal, TypedDict, Union\n\n")
	fmt.Fprintf(&b, "PROBLEM_PREFIX = %q\n\n", problemPrefix)
	for _, kv := range []struct {
		name string
		vals []string
	}{{"STATUSES", c.Statuses}, {"PENDING_STATUSES", c.Pending}, {"TERMINAL_STATUSES", c.Terminal},
		{"CATEGORIES", c.Categories}, {"PROBLEM_TYPES", c.ProblemTypes}, {"TOOL_FORMATS", c.ToolFormats}} {
		fmt.Fprintf(&b, "%s = %s\n", kv.name, pyTuple(kv.vals))
	}
	b.WriteString("\nERROR_CLASS_BY_TYPE = {\n")
	for _, kv := range c.ByType {
		fmt.Fprintf(&b, "    %q: %q,\n", kv[0], kv[1])
	}
	b.WriteString("}\n\nERROR_CLASS_BY_STATUS = {\n")
	for _, kv := range c.ByStatus {
		fmt.Fprintf(&b, "    %s: %q,\n", kv[0], kv[1])
	}
	b.WriteString("}\n\nERROR_CLASSES = " + pyTuple(c.Classes) + "\n")
	required := map[string][]string{}
	for _, name := range d.schemaOrder {
		s := d.Components.Schemas[name]
		if !pyIdent.MatchString(name) {
			return nil, fmt.Errorf("schema name %q is not an identifier", name)
		}
		b.WriteString("\n")
		if s.Desc != "" {
			for _, line := range wrap(s.Desc, 88) {
				b.WriteString("# " + line + "\n")
			}
		}
		switch {
		case len(s.Properties) > 0:
			fmt.Fprintf(&b, "%s = TypedDict(%q, {\n", name, name)
			for _, p := range s.propOrder {
				fmt.Fprintf(&b, "    %q: %s,\n", p, pyType(s.Properties[p]))
			}
			b.WriteString("}, total=False)\n")
			if len(s.Required) > 0 {
				required[name] = s.Required
			}
		default:
			fmt.Fprintf(&b, "%s = %s\n", name, pyType(s))
		}
	}
	b.WriteString("\n# The keys each schema's objects always hold.\nREQUIRED = {\n")
	for _, name := range d.schemaOrder {
		if r := required[name]; r != nil {
			fmt.Fprintf(&b, "    %q: %s,\n", name, pyTuple(r))
		}
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

func jsArray(vals []string) string {
	var q []string
	for _, v := range vals {
		q = append(q, strconv.Quote(v))
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func javascript(c constants) (js, dts []byte) {
	var b, t bytes.Buffer
	fmt.Fprintf(&b, "// The API's enums and error tables, from its OpenAPI document.\n// %s\n// Types: schema.d.ts; the wire types: openapi.d.ts.\n\n", header)
	fmt.Fprintf(&t, "// Declarations of schema.js.\n// %s\n\n", header)
	fmt.Fprintf(&b, "export const PROBLEM_PREFIX = %q;\n", problemPrefix)
	fmt.Fprintf(&t, "export declare const PROBLEM_PREFIX: %q;\n", problemPrefix)
	for _, kv := range []struct {
		name string
		vals []string
	}{{"STATUSES", c.Statuses}, {"PENDING_STATUSES", c.Pending}, {"TERMINAL_STATUSES", c.Terminal},
		{"CATEGORIES", c.Categories}, {"PROBLEM_TYPES", c.ProblemTypes}, {"TOOL_FORMATS", c.ToolFormats}} {
		fmt.Fprintf(&b, "export const %s = Object.freeze(%s);\n", kv.name, jsArray(kv.vals))
		var lits []string
		for _, v := range kv.vals {
			lits = append(lits, strconv.Quote(v))
		}
		fmt.Fprintf(&t, "export declare const %s: readonly [%s];\n", kv.name, strings.Join(lits, ", "))
	}
	b.WriteString("\n/** The error class (errors.js) of each problem type, by the part after PROBLEM_PREFIX. */\nexport const ERROR_CLASS_BY_TYPE = Object.freeze({\n")
	for _, kv := range c.ByType {
		fmt.Fprintf(&b, "  %q: %q,\n", kv[0], kv[1])
	}
	b.WriteString("});\n\n/** The error class of an answer of no known problem type, by its HTTP status. */\nexport const ERROR_CLASS_BY_STATUS = Object.freeze({\n")
	for _, kv := range c.ByStatus {
		fmt.Fprintf(&b, "  %s: %q,\n", kv[0], kv[1])
	}
	b.WriteString("});\n\nexport const ERROR_CLASSES = Object.freeze(" + jsArray(c.Classes) + ");\n")
	var classes []string
	for _, cls := range c.Classes {
		classes = append(classes, strconv.Quote(cls))
	}
	fmt.Fprintf(&t, "export type ErrorClassName = %s;\n", strings.Join(classes, " | "))
	t.WriteString("export declare const ERROR_CLASS_BY_TYPE: Readonly<Record<string, ErrorClassName>>;\n")
	t.WriteString("export declare const ERROR_CLASS_BY_STATUS: Readonly<Record<number, ErrorClassName>>;\n")
	t.WriteString("export declare const ERROR_CLASSES: readonly ErrorClassName[];\n")
	return b.Bytes(), t.Bytes()
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
