package e2bapi

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestWorkPath(t *testing.T) {
	for in, want := range map[string]string{"/home/user/a.txt": "a.txt", "a/b.csv": "a/b.csv", "/home/user": "", "/work/x": "x", "/home/user/d/../e": "e"} {
		got, err := workPath(in)
		if err != nil || got != want {
			t.Errorf("workPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/etc/passwd", "/home/user/../../etc/passwd", "/home/username/x"} {
		if got, err := workPath(in); err == nil {
			t.Errorf("workPath(%q) = %q, nil; want an error", in, got)
		}
	}
}

func TestMatch(t *testing.T) {
	s := &Surface{}
	for path, want := range map[string]bool{"/sandboxes": true, "/sandboxes/x/timeout": true, "/v2/sandboxes": true,
		"/v1/sessions": false, "/healthz": false, "/sandboxesx": false} {
		if got := s.Match(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("Match(%s) = %v", path, got)
		}
	}
	r := httptest.NewRequest("POST", "/execute", nil)
	r.Header.Set(headerSandboxID, "x")
	if !s.Match(r) {
		t.Error("a request naming a sandbox is not matched")
	}
}

func raw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }

func TestExecutionLines(t *testing.T) {
	ec := 1
	res := &job.CallResult{Seq: 3, Result: job.Result{Stdout: "hi\n", ExitCode: &ec,
		Outputs: []job.Output{
			{Type: job.OutputDisplay, Data: map[string]json.RawMessage{job.MIMEText: raw("<Figure>"), job.MIMEPNG: raw("iVBO"), "application/x-thing": raw("z")}},
			{Type: job.OutputResult, Data: map[string]json.RawMessage{job.MIMEText: raw("'abc'"), job.MIMEHTML: raw("<table/>")}},
		},
		Error: &job.Failure{Category: "runtime_error", Message: "ZeroDivisionError: division by zero",
			Exception: &job.Exception{Type: "ZeroDivisionError", Message: "division by zero", SourceLine: "1/0",
				Frames: []job.Frame{{File: "<cell>", Line: 2, Function: "<module>"}}}}}}
	b, _ := json.Marshal(executionLines(res, &streamed{}))
	var lines []map[string]any
	_ = json.Unmarshal(b, &lines)
	if len(lines) != 6 {
		t.Fatalf("%d lines: %s", len(lines), b)
	}
	if lines[0]["type"] != "stdout" || lines[0]["text"] != "hi\n" {
		t.Errorf("stdout: %v", lines[0])
	}
	if l := lines[1]; l["png"] != "iVBO" || l["is_main_result"] != false || l["extra"].(map[string]any)["application/x-thing"] != "z" {
		t.Errorf("display: %v", l)
	}
	if l := lines[2]; l["text"] != "abc" || l["html"] != "<table/>" || l["is_main_result"] != true {
		t.Errorf("result: %v", l)
	}
	want := "Traceback (most recent call last):\n  File \"<cell>\", line 2, in <module>\n    1/0\nZeroDivisionError: division by zero"
	if l := lines[3]; l["name"] != "ZeroDivisionError" || l["value"] != "division by zero" || l["traceback"] != want {
		t.Errorf("error: %v", l)
	}
	if l := lines[4]; l["type"] != "number_of_executions" || l["execution_count"] != float64(3) {
		t.Errorf("count: %v", l)
	}
	if lines[5]["type"] != "end_of_execution" {
		t.Errorf("end: %v", lines[5])
	}
}

// A session call's frames are not the exception's (its code is no file of
// /work): the traceback its interpreter printed on stderr is taken.
func TestTracebackFromStderr(t *testing.T) {
	tb := "Traceback (most recent call last):\n  File \"<call 6>\", line 3, in <module>\n  File \"<call 6>\", line 2, in f\nZeroDivisionError: division by zero"
	e := &job.Exception{Type: "ZeroDivisionError", Message: "division by zero", Line: 2}
	if got := traceback(e, "noise\n"+tb+"\n"); got != tb {
		t.Errorf("from stderr: %q", got)
	}
	// Another exception's traceback on stderr is not this one's.
	if got := traceback(e, "Traceback (most recent call last):\nValueError: x\n"); got != "  line 2\nZeroDivisionError: division by zero" {
		t.Errorf("without its traceback on stderr: %q", got)
	}
}
