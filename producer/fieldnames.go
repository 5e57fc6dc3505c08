package producer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
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
}

var (
	fileSchema   = &fieldSchema{fields: map[string]*fieldSchema{"name": nil, "content": nil, "encoding": nil}}
	limitsSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"timeout_ms": nil, "memory_mb": nil, "cpu_ms": nil, "pids": nil, "output_bytes": nil, "disk_mb": nil,
	}}
	cacheSchema = &fieldSchema{fields: map[string]*fieldSchema{"max_age_s": nil}}
	// specSchema is job.Spec.
	specSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"runtime": nil, "code": nil, "stdin": nil, "args": nil,
		"env":    {mapNames: true},
		"files":  {elem: fileSchema},
		"limits": limitsSchema,
		"cache":  cacheSchema,
	}}
	// batchSchema is the batch body; each job is checked on its own with
	// specSchema, so one bad job fails alone.
	batchSchema = &fieldSchema{fields: map[string]*fieldSchema{"jobs": nil}}
)

// checkFieldNames walks raw and refuses, with a 400 naming the field, any
// object key repeated in the same object and any key that differs from a
// documented name only in case. Syntax errors are left to the decoder,
// which reports them with offsets.
func checkFieldNames(raw []byte, schema *fieldSchema, where string) *problem {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	p, err := walkValue(dec, schema, where, "")
	if p != nil {
		return p
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil // malformed: decodeStrict says where
	}
	return nil
}

// walkValue consumes one value from dec. path is the JSON path so far
// ("limits", "files[2]"); where prefixes it in problems ("jobs[3].").
func walkValue(dec *json.Decoder, schema *fieldSchema, where, path string) (*problem, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil, nil
	}
	switch d {
	case '[':
		var elem *fieldSchema
		if schema != nil {
			elem = schema.elem
		}
		for i := 0; dec.More(); i++ {
			if p, err := walkValue(dec, elem, where, fmt.Sprintf("%s[%d]", path, i)); p != nil || err != nil {
				return p, err
			}
		}
		_, err = dec.Token() // ']'
		return nil, err
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			name, _ := kt.(string)
			field := joinPath(path, name)
			if seen[name] {
				p := newProblem(http.StatusBadRequest, typeDuplicateField, "Duplicate field",
					fmt.Sprintf("%sfield %q appears more than once in the same object; send each field once", where, field))
				p.Field = where + field
				return p, nil
			}
			seen[name] = true
			var sub *fieldSchema
			if schema != nil {
				switch {
				case schema.values != nil:
					sub = schema.values
				case schema.fields != nil:
					s, known := schema.fields[name]
					if !known {
						for doc := range schema.fields {
							if strings.EqualFold(doc, name) {
								p := newProblem(http.StatusBadRequest, typeFieldCase, "Field name in the wrong case",
									fmt.Sprintf("%sfield %q is not a field of this API: field names are case-sensitive, use %q", where, field, joinPath(path, doc)))
								p.Field = where + field
								return p, nil
							}
						}
					}
					sub = s
				}
			}
			if p, err := walkValue(dec, sub, where, field); p != nil || err != nil {
				return p, err
			}
		}
		_, err = dec.Token() // '}'
		return nil, err
	}
	return nil, nil
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
