package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestResultFrameRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	spilled := &job.OutputObject{ObjectRef: job.ObjectRef{Tenant: "t1", SHA256: strings.Repeat("ab", 32), Size: 1 << 24}, UTF8: false}
	cases := map[string]job.Result{
		"text":          {ID: "a", Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), StdoutBytes: 3, FinishedAt: &at},
		"invalid utf-8": {ID: "b", Status: job.StatusFailed, Error: job.NewFailure(job.CategoryRuntimeError, "x <&> y")},
		"spilled":       {ID: "c", Status: job.StatusSucceeded, StdoutObject: spilled, StdoutTruncated: true, StdoutBytes: 1 << 24},
	}
	outputs := map[string][2][]byte{
		"text":          {[]byte("hi\n"), []byte("")},
		"invalid utf-8": {[]byte("ok\xff\xfe"), []byte("<\x01\x00>")},
		"spilled":       {nil, []byte("warning\n")},
	}
	for name, res := range cases {
		t.Run(name, func(t *testing.T) {
			res.SetOutput(outputs[name][0], outputs[name][1])
			b, err := encodeResult(res)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeResult(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, res) {
				t.Fatalf("round trip changed the result:\n got %+v\nwant %+v", got, res)
			}
		})
	}
}

// Output is stored as its bytes: a stream of control bytes, which JSON
// escapes to six bytes each, costs one byte a byte.
func TestResultFrameStoresOutputAsBytes(t *testing.T) {
	out := bytes.Repeat([]byte{1}, job.MaxInlineOutputBytes)
	errb := bytes.Repeat([]byte("<"), job.MaxInlineOutputBytes)
	var res job.Result
	res.Status = job.StatusSucceeded
	res.SetOutput(out, errb)
	b, err := encodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(res)
	if len(b) > 2*job.MaxInlineOutputBytes+1024 {
		t.Fatalf("stored form is %d bytes for %d bytes of output (the JSON is %d)", len(b), 2*job.MaxInlineOutputBytes, len(js))
	}
	t.Logf("2 × %d bytes of output: stored %d bytes, JSON would be %d", job.MaxInlineOutputBytes, len(b), len(js))
}

func TestResultFrameBound(t *testing.T) {
	var res job.Result
	res.Status = job.StatusSucceeded
	res.SetOutput(bytes.Repeat([]byte("x"), MaxResultValueBytes), nil)
	if _, err := encodeResult(res); !errors.Is(err, ErrValueTooLarge) {
		t.Fatalf("a result over the bound: got %v, want ErrValueTooLarge", err)
	}
}

func TestResultDecodesOlderJSON(t *testing.T) {
	want := job.Result{ID: "old", Status: job.StatusSucceeded, Stdout: "hello\n", StdoutBytes: 6}
	b, _ := json.Marshal(want)
	got, err := decodeResult(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestResultFrameCorrupt(t *testing.T) {
	var res job.Result
	res.Status = job.StatusSucceeded
	res.SetOutput([]byte("hello"), []byte("world"))
	b, err := encodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(append([]byte{}, b...), 'x'), []byte(resultFrameMagic)} {
		if _, err := decodeResult(bad); err == nil {
			t.Errorf("decoded a corrupt frame of %d bytes", len(bad))
		}
	}
}

// A Result carrying as much as the worker keeps inline -- two full output
// streams and display outputs up to their inline bound, with the most
// escaping JSON can add to a value -- still fits one stored value, and
// round-trips.
func TestStoredResultFitsDisplayOutputs(t *testing.T) {
	stream := strings.Repeat("x", job.MaxInlineOutputBytes)
	val := json.RawMessage(`"` + strings.Repeat(`\"`, job.MaxOutputValueInline/2-1) + `"`)
	var outs []job.Output
	for used := 0; used+len(val) <= job.MaxOutputsInline; used += len(val) {
		outs = append(outs, job.Output{Type: job.OutputDisplay, Data: map[string]json.RawMessage{job.MIMEText: val}})
	}
	res := job.Result{ID: "j", Status: job.StatusSucceeded, Stdout: stream, Stderr: stream, Outputs: outs,
		Error: &job.Failure{Exception: &job.Exception{Message: strings.Repeat("m", job.MaxExceptionMessage)}}}
	b, err := encodeResult(res)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	got, err := decodeResult(b)
	if err != nil || len(got.Outputs) != len(outs) || got.Outputs[0].Text(job.MIMEText) != strings.Repeat(`"`, job.MaxOutputValueInline/2-1) {
		t.Fatalf("round trip: %v, %d outputs", err, len(got.Outputs))
	}
}
