package initproto

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The shared vectors (testdata/), as this side reads them: what the worker
// encodes is byte for byte what every launcher's tests read, and what a
// zygote reports decodes into the worker's type with no key left over.
// The Python and Node launchers' tests read the same files
// (launchers_test.go runs them).

func readVectors(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestVectorsFrames(t *testing.T) {
	var vs struct {
		About string
		Valid []struct {
			Name        string
			Frame       string
			Want        json.RawMessage
			WorkerSends bool `json:"worker_sends"`
		}
		Invalid []struct{ Name, Frame, Error string }
	}
	readVectors(t, "frames.json", &vs)
	if len(vs.Valid) < 3 || len(vs.Invalid) < 10 {
		t.Fatalf("%d valid and %d invalid frames: the vectors are missing", len(vs.Valid), len(vs.Invalid))
	}
	for _, v := range vs.Valid {
		if !v.WorkerSends {
			if !strings.HasPrefix(v.Frame, "KILN/"+strconv.Itoa(ProtocolMajor)+".") || strings.HasPrefix(v.Frame, FrameMagic+" ") {
				t.Errorf("%s: a frame the worker does not send must be of this major and another minor: %.20q", v.Name, v.Frame)
			}
			continue
		}
		var f Frame
		dec := json.NewDecoder(bytes.NewReader(v.Want))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			t.Fatalf("%s: want: %v", v.Name, err)
		}
		got, err := f.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != v.Frame {
			t.Errorf("%s:\n got %q\nwant %q", v.Name, got, v.Frame)
		}
	}
	for _, v := range vs.Invalid {
		if strings.HasPrefix(v.Frame, FrameMagic+" ") && strings.Contains(v.Error, "protocol") {
			t.Errorf("%s: refused for its protocol, yet of this version", v.Name)
		}
	}
}

func TestVectorsBoxHeaders(t *testing.T) {
	var vs struct {
		About string
		Valid []struct {
			Name        string
			N           int
			Header      string
			WorkerSends bool `json:"worker_sends"`
		}
		Invalid []struct{ Name, Header, Error string }
	}
	readVectors(t, "box_headers.json", &vs)
	if len(vs.Valid) < 3 || len(vs.Invalid) < 5 {
		t.Fatalf("%d valid and %d invalid headers: the vectors are missing", len(vs.Valid), len(vs.Invalid))
	}
	for _, v := range vs.Valid {
		if len(v.Header) != BoxHeaderSize {
			t.Errorf("%s: %d bytes", v.Name, len(v.Header))
		}
		if v.WorkerSends && string(BoxHeader(v.N)) != v.Header {
			t.Errorf("%s: BoxHeader(%d) = %q, want %q", v.Name, v.N, BoxHeader(v.N), v.Header)
		}
	}
}

func TestVectorsBoxParams(t *testing.T) {
	var vs struct {
		About string
		Valid []struct {
			Name        string
			Params      string
			Want        json.RawMessage
			WorkerSends bool `json:"worker_sends"`
		}
		Invalid []struct{ Name, Params, Error string }
	}
	readVectors(t, "box_params.json", &vs)
	if len(vs.Valid) < 3 || len(vs.Invalid) < 8 {
		t.Fatalf("%d valid and %d invalid parameters: the vectors are missing", len(vs.Valid), len(vs.Invalid))
	}
	for _, v := range vs.Valid {
		if !v.WorkerSends {
			continue
		}
		var p BoxParams
		dec := json.NewDecoder(bytes.NewReader(v.Want))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("%s: want: %v", v.Name, err)
		}
		p.Version = "" // Encode sets it
		got, err := p.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != v.Params {
			t.Errorf("%s:\n got %s\nwant %s", v.Name, got, v.Params)
		}
	}
}

func TestVectorsReports(t *testing.T) {
	var vs struct {
		About   string
		Reports []struct {
			Name   string
			Ending json.RawMessage
			Report map[string]any
		}
	}
	readVectors(t, "reports.json", &vs)
	if len(vs.Reports) < 5 {
		t.Fatalf("%d reports: the vectors are missing", len(vs.Reports))
	}
	for _, v := range vs.Reports {
		raw, err := json.Marshal(v.Report)
		if err != nil {
			t.Fatal(err)
		}
		var rep ZygoteReport
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rep); err != nil {
			t.Errorf("%s: the worker does not read a key of %s: %v", v.Name, raw, err)
			continue
		}
		back, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var decoded map[string]any
		if err := json.Unmarshal(back, &decoded); err != nil {
			t.Fatal(err)
		}
		for k, want := range v.Report {
			if !reflect.DeepEqual(decoded[k], want) {
				t.Errorf("%s: %s decodes as %v, sent %v", v.Name, k, decoded[k], want)
			}
		}
	}
}

func TestVectorsStatus(t *testing.T) {
	var vs struct {
		About string
		Valid []struct {
			Name, Nonce, Status string
			Want                Status
		}
		Invalid []struct{ Name, Nonce, Status, Error string }
	}
	readVectors(t, "status.json", &vs)
	for _, v := range vs.Valid {
		got, err := Parse([]byte(v.Status), v.Nonce)
		if err != nil || got != v.Want {
			t.Errorf("%s: %+v %v; want %+v", v.Name, got, err, v.Want)
		}
		if enc := v.Want.Encode(); string(enc) != v.Status {
			t.Errorf("%s: Encode = %q, want %q", v.Name, enc, v.Status)
		}
	}
	for _, v := range vs.Invalid {
		if _, err := Parse([]byte(v.Status), v.Nonce); err == nil || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("%s: %v; want an error containing %q", v.Name, err, v.Error)
		}
	}
}

// Protocol spells ProtocolMajor and ProtocolMinor.
func TestProtocolVersion(t *testing.T) {
	if want := strconv.Itoa(ProtocolMajor) + "." + strconv.Itoa(ProtocolMinor); Protocol != want {
		t.Errorf("Protocol %q, want %q", Protocol, want)
	}
}
