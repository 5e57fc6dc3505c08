package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The two languages' files: Python (a module of constants, tables and
// TypedDicts) and JavaScript (constants and tables, with declarations).

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
