package redact

import (
	"encoding/json"
	"reflect"
	"strconv"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Result redaction works by construction, not by a list of fields: Result
// walks the whole job.Result by reflection and redacts every string in it
// (struct fields, slice elements, map keys and values, and each string of
// a json.RawMessage, object keys included), so a field added to the result
// is redacted without anyone remembering to add it. Two tags on job's types
// say otherwise, each a decision visible where the field is declared:
//
//	redact:"platform"  set by the platform, never from the program's words
//	                   (ids, digests, statuses): left as it is.
//	redact:"stream"    stdout, stderr and their base64 forms: redacted as
//	                   the program's bytes, once per stream, by Result.
//
// TestResultRedactsEveryStringField plants a secret in every string the
// result type can hold and fails on any that survives outside a
// platform field.
const tagName = "redact"

// Tag values of job's types (see tagName).
const (
	TagPlatform = "platform"
	TagStream   = "stream"
)

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	timeType       = reflect.TypeFor[time.Time]()
)

// Result replaces key-like strings everywhere in r a program's words can
// reach: stdout and stderr (as bytes, their base64 forms kept in step),
// the error message, the exception's every field, display outputs (every
// MIME type's value, each string of a JSON value, and the MIME types
// themselves), artifact names, egress records. It returns what it
// replaced, by kind, and adds the counts to r.Redactions. Artifact names
// that came out the same are made distinct again ("~2", "~3", ...): they
// name downloads.
func (d *Detector) Result(r *job.Result) Counts {
	if d.Off() || r == nil {
		return nil
	}
	counts := Counts{}
	r.Stdout, r.StdoutBase64 = d.stream(r.Stdout, r.StdoutBase64, counts)
	r.Stderr, r.StderrBase64 = d.stream(r.Stderr, r.StderrBase64, counts)
	d.walk(reflect.ValueOf(r).Elem(), counts)
	uniqueNames(r.Artifacts)
	if len(counts) == 0 {
		return nil
	}
	if r.Redactions == nil {
		r.Redactions = map[string]int{}
	}
	for k, v := range counts {
		r.Redactions[k] += v
	}
	return counts
}

// Value redacts every string of the value ptr points to (a wire value
// other than a result: an audit record's egress connection), as Result
// does a result's, fields tagged redact:"platform" aside. It returns what
// it replaced; a nil pointer or an off detector changes nothing.
func (d *Detector) Value(ptr any) Counts {
	v := reflect.ValueOf(ptr)
	if d.Off() || v.Kind() != reflect.Pointer || v.IsNil() {
		return nil
	}
	counts := Counts{}
	d.walk(v.Elem(), counts)
	if len(counts) == 0 {
		return nil
	}
	return counts
}

// stream redacts one output stream given as the result carries it: text,
// and the exact bytes in base64 when they are not valid UTF-8.
func (d *Detector) stream(text, b64 string, counts Counts) (string, string) {
	raw, err := job.RawOutput(text, b64)
	if err != nil {
		raw = []byte(text)
	}
	out, c := d.Redact(raw)
	if c == nil {
		return text, b64
	}
	counts.Add(c)
	var tmp job.Result
	tmp.SetOutput(out, nil)
	return tmp.Stdout, tmp.StdoutBase64
}

// walk redacts every string reachable from v, which is settable.
func (d *Detector) walk(v reflect.Value, counts Counts) {
	switch v.Kind() {
	case reflect.String:
		if out, c := d.String(v.String()); c != nil {
			counts.Add(c)
			v.SetString(out)
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			d.walkElem(v, counts)
		}
	case reflect.Struct:
		if v.Type() == timeType {
			return
		}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			switch f.Tag.Get(tagName) {
			case TagPlatform, TagStream:
				continue
			}
			d.walk(v.Field(i), counts)
		}
	case reflect.Slice:
		if v.Type() == rawMessageType {
			if out, c := d.JSON(v.Bytes()); c != nil {
				counts.Add(c)
				v.SetBytes(out)
			}
			return
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			// Bytes other than JSON: the program's, redacted as such.
			if out, c := d.Redact(v.Bytes()); c != nil {
				counts.Add(c)
				v.SetBytes(out)
			}
			return
		}
		for i := range v.Len() {
			d.walk(v.Index(i), counts)
		}
	case reflect.Array:
		for i := range v.Len() {
			d.walk(v.Index(i), counts)
		}
	case reflect.Map:
		d.walkMap(v, counts)
	}
}

// walkElem redacts what pointer or interface v holds (an interface's
// value is not settable in place: a copy is redacted and put back).
func (d *Detector) walkElem(v reflect.Value, counts Counts) {
	if v.Kind() == reflect.Pointer {
		d.walk(v.Elem(), counts)
		return
	}
	e := reflect.New(v.Elem().Type()).Elem()
	e.Set(v.Elem())
	d.walk(e, counts)
	v.Set(e)
}

// walkMap redacts a map's keys and values. A key that changes is moved; a
// key that comes out the same as another is made distinct ("~2").
func (d *Detector) walkMap(v reflect.Value, counts Counts) {
	if v.IsNil() {
		return
	}
	keys := v.MapKeys()
	for _, k := range keys {
		val := reflect.New(v.Type().Elem()).Elem()
		val.Set(v.MapIndex(k))
		d.walk(val, counts)
		nk := reflect.New(k.Type()).Elem()
		nk.Set(k)
		d.walk(nk, counts)
		if nk.Equal(k) {
			v.SetMapIndex(k, val)
			continue
		}
		v.SetMapIndex(k, reflect.Value{})
		if nk.Kind() == reflect.String {
			base := nk.String()
			for n := 2; v.MapIndex(nk).IsValid(); n++ {
				nk.SetString(base + "~" + strconv.Itoa(n))
			}
		}
		v.SetMapIndex(nk, val)
	}
}

// JSON redacts every string of the JSON text b, object keys included, and
// returns it with everything else as it was; b itself is not changed. A
// string is compared as its value, escapes decoded, so an escaped key
// ("\u0041KIA...") is caught too. b is taken as valid JSON (text that is
// not is redacted as bytes).
func (d *Detector) JSON(b []byte) ([]byte, Counts) {
	if d.Off() || len(b) == 0 {
		return b, nil
	}
	if !json.Valid(b) {
		return d.Redact(b)
	}
	var out []byte
	var counts Counts
	last := 0
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		end := stringEnd(b, i)
		lit := b[i:end]
		var s string
		if json.Unmarshal(lit, &s) == nil {
			if red, c := d.String(s); c != nil {
				if counts == nil {
					counts = Counts{}
					out = make([]byte, 0, len(b)+64)
				}
				counts.Add(c)
				enc, _ := json.Marshal(red)
				out = append(append(out, b[last:i]...), enc...)
				last = end
			}
		}
		i = end - 1
	}
	if counts == nil {
		return b, nil
	}
	return append(out, b[last:]...), counts
}

// stringEnd is the index just past the JSON string literal that starts
// with the quote at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// uniqueNames keeps artifact names distinct (they name downloads) when two
// redacted names came out the same: later ones get "~2", "~3", ...
func uniqueNames(as []job.Artifact) {
	seen := make(map[string]bool, len(as))
	for i := range as {
		name := as[i].Name
		for n := 2; seen[name]; n++ {
			name = as[i].Name + "~" + strconv.Itoa(n)
		}
		as[i].Name = name
		seen[name] = true
	}
}
