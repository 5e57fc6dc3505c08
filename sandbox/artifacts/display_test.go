package artifacts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// The channel's parser keeps well-formed outputs, counts the rest, and
// stops at its bound.
func TestReadOutputStream(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"type":"display_data","data":{"text/plain":"1"}}`,
		`not json`,
		`{"type":"display_data","data":{"text/html":"<b>no text/plain</b>"}}`,
		`{"type":"bogus","data":{"text/plain":"x"}}`,
		`{"type":"execute_result","data":{"text/plain":"2","application/json":{"a":1}}}`,
		`{"exception":{"type":"ValueError","message":"bad","line":3}}`,
		`{"dropped":5}`,
	}, "\n") + "\n"
	st := ReadOutputStream(strings.NewReader(in), true)
	if len(st.outputs) != 2 || st.outputs[1].Text(job.MIMEText) != "2" || st.dropped != 8 || st.exception == nil || st.exception.Line != 3 {
		t.Fatalf("got %+v", st)
	}
	big := `{"type":"display_data","data":{"text/plain":"` + strings.Repeat("a", job.MaxOutputsBytes) + `"}}` + "\n" +
		`{"type":"display_data","data":{"text/plain":"after"}}` + "\n"
	st = ReadOutputStream(strings.NewReader(big), true)
	if len(st.outputs) != 0 || !st.truncated || st.dropped != 1 {
		t.Fatalf("over the bound: %d outputs, truncated %v, dropped %d", len(st.outputs), st.truncated, st.dropped)
	}
}

// Values over the inline bounds go to the store; with no store they are
// dropped and the cut is reported, text/plain always staying.
func TestPlaceOutputs(t *testing.T) {
	t.Parallel()
	long := json.RawMessage(`"` + strings.Repeat("z", job.MaxOutputValueInline) + `"`)
	mk := func() OutputStream {
		return OutputStream{outputs: []job.Output{{Type: job.OutputDisplay, Data: map[string]json.RawMessage{
			job.MIMEText: long, job.MIMEHTML: long, job.MIMEMarkdown: json.RawMessage(`"ok"`)}}}}
	}
	mem := &testkit.MemStore{}
	var res job.Result
	res.Artifacts = []job.Artifact{{Name: job.OutputArtifactDir + "/1.txt"}} // the program's own file of that name
	PlaceOutputs(t.Context(), mem.Put, &res, mk())
	o := res.Outputs[0]
	if o.Artifacts[job.MIMEText] != job.OutputArtifactDir+"/1.txt.2" || o.Artifacts[job.MIMEHTML] != job.OutputArtifactDir+"/1.html" ||
		o.Text(job.MIMEMarkdown) != "ok" || o.Has(job.MIMEHTML) || len(o.Text(job.MIMEText)) > 4100 || res.OutputsTruncated {
		t.Fatalf("with a store: %+v (truncated %v)", o, res.OutputsTruncated)
	}
	if len(res.Artifacts) != 3 || len(mem.Objects()) != 1 { // the same bytes twice: one object
		t.Fatalf("artifacts %+v, %d objects", res.Artifacts, len(mem.Objects()))
	}
	res = job.Result{}
	PlaceOutputs(t.Context(), nil, &res, mk())
	o = res.Outputs[0]
	if !res.OutputsTruncated || o.Has(job.MIMEHTML) || !o.Has(job.MIMEText) || len(o.Artifacts) != 0 {
		t.Fatalf("without a store: %+v (truncated %v)", o, res.OutputsTruncated)
	}
}

// The channel's file is read only when it is a regular file (never through
// a link, never blocking on a FIFO), and a file past the bound is flagged.
func TestReadOutputsFile(t *testing.T) {
	t.Parallel()
	if st, err := ReadOutputsFile(""); err != nil || len(st.outputs) != 0 {
		t.Errorf("no file: %+v, %v", st, err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "outputs")
	line := `{"type":"display_data","data":{"text/plain":"1"}}` + "\n"
	if err := os.WriteFile(file, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := ReadOutputsFile(file); err != nil || len(st.outputs) != 1 || st.truncated {
		t.Errorf("one output: %+v, %v", st, err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo} {
		if _, err := ReadOutputsFile(p); err == nil {
			t.Errorf("%s read", filepath.Base(p))
		}
	}
	if err := os.Truncate(file, job.MaxOutputsBytes+1); err != nil {
		t.Fatal(err)
	}
	if st, err := ReadOutputsFile(file); err != nil || len(st.outputs) != 1 || !st.truncated {
		t.Errorf("past the bound: %d outputs, truncated %v, %v", len(st.outputs), st.truncated, err)
	}
}

// The launcher's exception goes only to a program's own failure that
// ended as the launcher ends an uncaught exception; anything else is not
// attached and counts as a channel record not kept. Frames outside the
// program's files are dropped.
func TestAttachException(t *testing.T) {
	t.Parallel()
	exc := func() *job.Exception {
		return &job.Exception{Type: "ValueError", Message: "bad", Line: 3, Frames: []job.Frame{
			{File: "/usr/lib/kiln/launch.py", Line: 700, Function: "run_job"},
			{File: "/work/main.py", Line: 3, Function: "<module>"},
			{File: "/work/../etc/x.py", Line: 1, Function: "f"},
			{File: "/work/lib.py", Line: 9, Function: "g"},
		}}
	}
	one := OutputStream{exception: exc(), exceptions: 1}
	failed := func(c job.Category, code int) job.Result {
		return job.Result{Status: job.StatusFailed, ExitCode: job.IntPtr(code), Error: &job.Failure{Category: c}}
	}
	for _, tc := range []struct {
		name string
		res  job.Result
		st   OutputStream
		want bool
	}{
		{"an uncaught exception", failed(job.CategoryRuntimeError, 1), one, true},
		{"a syntax error", failed(job.CategorySyntaxError, 1), one, true},
		{"a record, then sys.exit(3)", failed(job.CategoryRuntimeError, 3), one, false},
		{"a record, then a signal", job.Result{Status: job.StatusFailed, Signal: "SIGKILL", Error: &job.Failure{Category: job.CategoryRuntimeError}}, one, false},
		{"two records", failed(job.CategoryRuntimeError, 1), OutputStream{exception: exc(), exceptions: 2}, false},
		{"a record, then KeyboardInterrupt's status", failed(job.CategoryRuntimeError, 130), one, false},
		{"KeyboardInterrupt", failed(job.CategoryRuntimeError, 130), OutputStream{exception: &job.Exception{Type: "KeyboardInterrupt"}, exceptions: 1}, true},
		{"a timeout", job.Result{Status: job.StatusTimedOut, Error: &job.Failure{Category: job.CategoryTimeout}}, one, false},
		{"a success", job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0)}, one, false},
	} {
		res := tc.res
		AttachException(&res, tc.st)
		got := res.Error != nil && res.Error.Exception != nil
		if got != tc.want {
			t.Errorf("%s: exception attached %v; want %v", tc.name, got, tc.want)
		}
		if !tc.want && (res.OutputsDropped != tc.st.exceptions || !res.OutputsTruncated) {
			t.Errorf("%s: outputs dropped %d, truncated %v; want the record counted", tc.name, res.OutputsDropped, res.OutputsTruncated)
		}
		if got && tc.st.exception.Type == "ValueError" {
			var files []string
			for _, f := range res.Error.Exception.Frames {
				files = append(files, f.File)
			}
			if strings.Join(files, ",") != "/work/main.py,/work/lib.py" {
				t.Errorf("%s: frames %v; want the program's own", tc.name, files)
			}
		}
	}
	res := job.Result{Error: &job.Failure{Category: job.CategoryRuntimeError}, ExitCode: job.IntPtr(1)}
	AttachException(&res, OutputStream{})
	if res.Error.Exception != nil || res.OutputsDropped != 0 {
		t.Errorf("an empty channel: exception %v, dropped %d", res.Error.Exception, res.OutputsDropped)
	}
}

// A JSON value nested deeper than job.MaxOutputJSONDepth is carried as
// its text and flagged; one at the depth is kept as a structure, and
// brackets inside strings do not count.
func TestDeepJSONIsFlattened(t *testing.T) {
	t.Parallel()
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	deep := nest(10_000)
	atDepth := `{"s": "` + strings.Repeat("[", 500) + `\"{{"}` + strings.Repeat(",", 0)
	atDepth = strings.Repeat(`{"a":`, job.MaxOutputJSONDepth-1) + atDepth + strings.Repeat("}", job.MaxOutputJSONDepth-1)
	in := `{"type":"display_data","data":{"text/plain":"deep","application/json":` + deep + `,"application/vnd.x+json":` + atDepth + `}}` + "\n"
	st := ReadOutputStream(strings.NewReader(in), true)
	if len(st.outputs) != 1 {
		t.Fatalf("got %+v", st)
	}
	o := st.outputs[0]
	if !slices.Equal(o.Flattened, []string{job.MIMEJSON}) || o.Text(job.MIMEJSON) != deep {
		t.Fatalf("flattened %v, value %.40s", o.Flattened, o.Data[job.MIMEJSON])
	}
	if string(o.Data["application/vnd.x+json"]) != atDepth {
		t.Fatalf("a value at the depth bound was changed: %.80s", o.Data["application/vnd.x+json"])
	}
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var back job.Output
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("the output does not decode: %v", err)
	}
	// Stored as an artifact when too long, the value is its JSON text.
	long := strings.Repeat("[", job.MaxOutputValueInline) + strings.Repeat("]", job.MaxOutputValueInline)
	st = ReadOutputStream(strings.NewReader(`{"type":"display_data","data":{"text/plain":"x","application/json":`+long+`}}`+"\n"), true)
	mem := &testkit.MemStore{}
	var res job.Result
	PlaceOutputs(t.Context(), mem.Put, &res, st)
	objs := mem.Objects()
	if len(objs) != 1 || res.Outputs[0].Artifacts[job.MIMEJSON] == "" {
		t.Fatalf("the long flattened value was not stored: %+v", res.Outputs[0])
	}
	for _, v := range objs {
		if string(v) != long {
			t.Fatalf("stored %.20s, want the JSON text", v)
		}
	}
}
