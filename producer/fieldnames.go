package producer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// fieldSchema is the documented shape of a JSON value, as far as field names
// go: the names an object may hold, the shape of a map's values (names free)
// or of an array's elements. A nil *fieldSchema accepts any names.
//
// encoding/json matches field names case-insensitively and keeps the last of
// duplicate keys, so {"code":"print(1)","CODE":"print(2)"} would run
// print(2) while a policy layer reading the documented "code" saw print(1).
// checkFieldNames refuses both before decoding.
type fieldSchema struct {
	fields map[string]*fieldSchema // object with these exact names
	values *fieldSchema            // object with free names (a map), values of this shape
	elem   *fieldSchema            // array elements
	// mapNames: names are free (env variables), so only duplicates are refused.
	mapNames bool
	// deferred: the value is decoded and checked on its own later (a
	// batch's job), so its strings' text is left to that check and one bad
	// job fails alone.
	deferred bool
}

var (
	fileSchema   = &fieldSchema{fields: map[string]*fieldSchema{"name": nil, "content": nil, "encoding": nil}}
	limitsSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"timeout_ms": nil, "memory_mb": nil, "cpu_ms": nil, "pids": nil, "output_bytes": nil, "disk_mb": nil,
	}}
	cacheSchema   = &fieldSchema{fields: map[string]*fieldSchema{"max_age_s": nil}}
	networkSchema = &fieldSchema{fields: map[string]*fieldSchema{"allow": nil}}
	// specSchema is job.Spec.
	specSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"runtime": nil, "code": nil, "stdin": nil, "args": nil,
		"env":    {mapNames: true},
		"files":  {elem: fileSchema},
		"limits": limitsSchema,
		"cache":  cacheSchema,
		// callback_url: a URL string (callback.go).
		"callback_url": nil,
		"budget":       nil,
		"network":      networkSchema,
		"metadata":     {mapNames: true},
	}}
	// batchSchema is the batch body; each job is checked on its own with
	// specSchema, so one bad job fails alone.
	batchSchema = &fieldSchema{fields: map[string]*fieldSchema{"jobs": {elem: &fieldSchema{deferred: true}}, "callback_url": nil}}
)

// maxDepth is where the scan stops looking: encoding/json refuses nesting
// deeper than 10000 anyway, and the scan must not recurse without bound.
const maxDepth = 10000

// checkFieldNames scans raw and refuses, with a 400 naming the field, any
// object key repeated in the same object, any key that differs from a
// documented name only in case, any other unknown key, and any string (key
// or value) that is not valid UTF-8 (see checkText). It copies
// nothing but keys, so a large body is not held twice. Syntax errors are
// left to the decoder, which reports them with offsets.
func checkFieldNames(raw []byte, schema *fieldSchema, where string) *problem {
	sc := scanner{raw: raw, where: where}
	sc.value(schema, "", 0)
	return sc.p
}

// scanner walks one JSON document. ok turns false at the first syntax error
// (or a problem found), which ends the walk.
type scanner struct {
	// open lets names a schema does not document through (a tool call's
	// members are another vendor's to extend): only repeats and case
	// variants of documented names are refused.
	open bool

	raw   []byte
	i     int
	where string
	p     *problem
	bad   bool
	// deferred counts the enclosing values whose text is checked later.
	deferred int
}

func (s *scanner) stop() bool { return s.bad || s.p != nil }

func (s *scanner) ws() {
	for s.i < len(s.raw) {
		switch s.raw[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// str skips a string starting at s.i ('"') and returns its raw content.
func (s *scanner) str() []byte {
	start := s.i + 1
	for j := start; j < len(s.raw); j++ {
		switch s.raw[j] {
		case '\\':
			j++
		case '"':
			s.i = j + 1
			return s.raw[start:j]
		}
	}
	s.bad = true
	return nil
}

func (s *scanner) value(schema *fieldSchema, path string, depth int) {
	s.ws()
	if s.i >= len(s.raw) || depth > maxDepth {
		s.bad = true
		return
	}
	if schema != nil && schema.deferred {
		s.deferred++
		defer func() { s.deferred-- }()
	}
	switch s.raw[s.i] {
	case '"':
		if text := s.str(); !s.bad && s.deferred == 0 && !validText(text) {
			s.p = s.invalidText(path, "")
		}
	case '[':
		s.i++
		var elem *fieldSchema
		if schema != nil {
			elem = schema.elem
		}
		for n := 0; !s.stop(); n++ {
			s.ws()
			if s.i < len(s.raw) && s.raw[s.i] == ']' {
				s.i++
				return
			}
			if n > 0 {
				if s.i >= len(s.raw) || s.raw[s.i] != ',' {
					s.bad = true
					return
				}
				s.i++
			}
			s.value(elem, fmt.Sprintf("%s[%d]", path, n), depth+1)
		}
	case '{':
		s.i++
		s.object(schema, path, depth)
	default: // number, true, false, null
		for s.i < len(s.raw) && !strings.ContainsRune(",]} \t\n\r", rune(s.raw[s.i])) {
			s.i++
		}
	}
}

func (s *scanner) object(schema *fieldSchema, path string, depth int) {
	seen := map[string]bool{}
	for n := 0; !s.stop(); n++ {
		s.ws()
		if s.i < len(s.raw) && s.raw[s.i] == '}' {
			s.i++
			return
		}
		if n > 0 {
			if s.i >= len(s.raw) || s.raw[s.i] != ',' {
				s.bad = true
				return
			}
			s.i++
			s.ws()
		}
		if s.i >= len(s.raw) || s.raw[s.i] != '"' {
			s.bad = true
			return
		}
		at := s.i
		rawName := s.str()
		if !s.bad && s.deferred == 0 && !validText(rawName) {
			s.p = s.invalidText(path, "a field name in ")
			return
		}
		name := string(rawName)
		if bytes.IndexByte(rawName, '\\') >= 0 {
			// An escaped key ("\u0063ode") means what it decodes to.
			if err := json.Unmarshal(s.raw[at:s.i], &name); err != nil {
				s.bad = true
				return
			}
		}
		s.ws()
		if s.i >= len(s.raw) || s.raw[s.i] != ':' {
			s.bad = true
			return
		}
		s.i++
		field := joinPath(path, name)
		if seen[name] {
			s.p = newProblem(http.StatusBadRequest, job.ProblemDuplicateField, "Duplicate field",
				fmt.Sprintf("%sfield %q appears more than once in the same object; send each field once", s.where, field))
			s.p.Field = s.where + field
			return
		}
		seen[name] = true
		var sub *fieldSchema
		if schema != nil && schema.fields != nil {
			var known bool
			if sub, known = schema.fields[name]; !known {
				if p := s.unknownField(schema, path, name, at); !s.open || p.Type == job.ProblemFieldNameCase {
					s.p = p
					return
				}
			}
		} else if schema != nil {
			sub = schema.values
		}
		s.value(sub, field, depth+1)
	}
}

// unknownField names the documented spelling of a case variant, or lists
// the valid fields.
func (s *scanner) unknownField(schema *fieldSchema, path, name string, at int) *problem {
	field := joinPath(path, name)
	for doc := range schema.fields {
		if strings.EqualFold(doc, name) {
			p := newProblem(http.StatusBadRequest, job.ProblemFieldNameCase, "Field name in the wrong case",
				fmt.Sprintf("%sfield %q is not a field of this API: field names are case-sensitive, use %q", s.where, field, joinPath(path, doc)))
			p.Field = s.where + field
			return p
		}
	}
	names := slices.Sorted(maps.Keys(schema.fields))
	where := "the body's fields"
	if path != "" {
		where = "the fields of " + path
	}
	p := newProblem(http.StatusBadRequest, job.ProblemUnknownField, "Unknown field",
		fmt.Sprintf("%sunknown field %q near byte offset %d; check its spelling (%s: %s)", s.where, field, at, where, strings.Join(names, ", ")))
	p.Field = s.where + field
	return p
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
