package redact_test

import (
	"encoding/base64"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// plantedKey is the key planted in every string of a result; a registered
// secret is planted beside it, so both kinds of detector are exercised.
const (
	plantedKey    = "AKIA" + "QWERTYUIOPASDFGH"
	plantedSecret = "tenant-vault-passphrase-42"
)

// platformFields are the result's strings tagged redact:"platform": set by
// the platform, never from a program's words, and so left as they are.
// Tagging another field is a decision about what a program can reach:
// this list makes it a visible one.
var platformFields = []string{
	"Result.ID", "Result.Status", "Result.Signal", "Result.Image", "Result.Error.Category",
	"Result.Artifacts[].SHA256", "Result.ArtifactsSkipped[].Reason", "Result.Redactions",
	"Result.ReplayOf", "Result.Replay", "Result.StdoutObject", "Result.StderrObject",
	"Result.Worker", "Result.TraceID",
}

// TestResultRedactsEveryStringField walks job.Result by reflection, plants
// a key and a registered secret in every string it can hold (each field,
// slice element, map key and value, and every string and object key of a
// JSON value), redacts it, and fails on any that survives outside a
// platform field. A new result field is covered, or this test names it: a
// field of a kind it cannot plant in (an interface, a channel) fails it too.
func TestResultRedactsEveryStringField(t *testing.T) {
	t.Parallel()
	fp, err := redact.Fingerprint(plantedSecret)
	if err != nil {
		t.Fatal(err)
	}
	d, err := redact.New(&job.RedactPolicy{Secrets: []job.SecretPrint{fp}})
	if err != nil {
		t.Fatal(err)
	}
	var r job.Result
	var platform []string
	plant(t, reflect.ValueOf(&r).Elem(), "Result", &platform)
	slices.Sort(platform)
	want := slices.Sorted(slices.Values(platformFields))
	if !slices.Equal(platform, want) {
		t.Errorf("fields tagged redact:%q: %v\nwant %v\n(update platformFields only for a field no program's words can reach)", redact.TagPlatform, platform, want)
	}
	// The streams as the sandbox makes them: stdout valid UTF-8, stderr
	// not, so its exact bytes ride in base64.
	r.SetOutput([]byte("out "+plantedKey+" "+plantedSecret+"\n"), []byte("err \xff "+plantedKey+" "+plantedSecret+"\n"))

	counts := d.Result(&r)
	if counts["aws_access_key"] == 0 || counts["secret"] == 0 {
		t.Errorf("counts %v: want both kinds", counts)
	}
	var leaks []string
	find(reflect.ValueOf(r), "Result", false, &leaks)
	for _, l := range leaks {
		t.Errorf("survived redaction: %s", l)
	}
	if raw, err := base64.StdEncoding.DecodeString(r.StderrBase64); err != nil || strings.Contains(string(raw), plantedKey) || !strings.Contains(string(raw), "\xff") {
		t.Errorf("stderr's exact bytes after redaction: %q %v", raw, err)
	}
	for _, o := range r.Outputs {
		for mime, v := range o.Data {
			if !json.Valid(v) {
				t.Errorf("output %s is no longer JSON: %s", mime, v)
			}
		}
	}
	if r.Redactions["aws_access_key"] != counts["aws_access_key"] {
		t.Errorf("redactions %v, counted %v", r.Redactions, counts)
	}
}

// planted is the text planted in one string.
func planted(what string) string { return what + " " + plantedKey + " " + plantedSecret + " end" }

// plantedJSON is a JSON value with the key in a value, in an object key,
// in an array and escaped.
func plantedJSON() json.RawMessage {
	return json.RawMessage(`{"a": "` + planted("value") + `", "` + planted("key") + `": [1, "` + planted("item") +
		`", {"deep": "\u0041KIA` + plantedKey[4:] + `"}], "n": 12.50}`)
}

// plant fills every string reachable from v with a planted key, naming the
// platform-tagged fields it passes in platform.
func plant(t *testing.T, v reflect.Value, path string, platform *[]string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(planted(path))
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		plant(t, v.Elem(), path, platform)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(1, 0)))
			return
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			p := path + "." + f.Name
			switch f.Tag.Get("redact") {
			case redact.TagPlatform:
				*platform = append(*platform, p)
			case redact.TagStream:
				continue // planted as the sandbox writes them, below
			case "":
			default:
				t.Errorf("%s: unknown redact tag %q", p, f.Tag.Get("redact"))
			}
			plant(t, v.Field(i), p, platform)
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes(plantedJSON())
			return
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte(planted(path)))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		plant(t, v.Index(0), path+"[]", platform)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k := reflect.New(v.Type().Key()).Elem()
		plant(t, k, path+"{key}", platform)
		e := reflect.New(v.Type().Elem()).Elem()
		plant(t, e, path+"{}", platform)
		v.SetMapIndex(k, e)
	default:
		t.Errorf("%s: a %s field; redaction and this test cover strings, structs, pointers, slices, maps and JSON values: extend both", path, v.Type())
	}
}

// find lists where a planted key or secret is left in v, outside platform
// fields.
func find(v reflect.Value, path string, platform bool, leaks *[]string) {
	leaked := func(s string) bool {
		return strings.Contains(s, plantedKey) || strings.Contains(s, plantedSecret) || strings.Contains(s, `\u0041KIA`)
	}
	switch v.Kind() {
	case reflect.String:
		if !platform && leaked(v.String()) {
			*leaks = append(*leaks, path+": "+v.String())
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			find(v.Elem(), path, platform, leaks)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.IsExported() {
				find(v.Field(i), path+"."+f.Name, platform || f.Tag.Get("redact") == redact.TagPlatform, leaks)
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			if !platform && leaked(string(v.Bytes())) {
				*leaks = append(*leaks, path+": "+string(v.Bytes()))
			}
			return
		}
		for i := range v.Len() {
			find(v.Index(i), path+"[]", platform, leaks)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			find(k, path+"{key}", platform, leaks)
			find(v.MapIndex(k), path+"{}", platform, leaks)
		}
	}
}

// A JSON value keeps everything but the strings it redacts: numbers,
// spacing and the order of keys as the program wrote them.
func TestJSONKeepsWhatItDoesNotRedact(t *testing.T) {
	t.Parallel()
	d, err := redact.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	in := `{"z": 1.50, "key": "` + plantedKey + `", "list": [ "ok", "a\"b" ], "a": null}`
	out, c := d.JSON([]byte(in))
	want := `{"z": 1.50, "key": "[REDACTED:aws_access_key]", "list": [ "ok", "a\"b" ], "a": null}`
	if string(out) != want || c["aws_access_key"] != 1 {
		t.Fatalf("got %s %v\nwant %s", out, c, want)
	}
	plain := []byte(`{"a": [1, 2, "three"]}`)
	if out, c := d.JSON(plain); string(out) != string(plain) || c != nil {
		t.Fatalf("nothing to redact: got %s %v", out, c)
	}
}
