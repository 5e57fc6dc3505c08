package producer

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestInvalidUTF8IsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		path, body, field string
	}{
		{"/v1/jobs", "{\"code\":\"print('\xff')\"}", "code"},
		{"/v1/jobs", "{\"code\":\"x\",\"stdin\":\"\xc3\x28\"}", "stdin"},
		{"/v1/jobs", "{\"code\":\"x\",\"args\":[\"ok\",\"\xed\xa0\x80\"]}", "args[1]"},
		{"/v1/jobs", "{\"code\":\"x\",\"env\":{\"A\":\"\xfe\"}}", "env.A"},
		{"/v1/jobs", "{\"code\":\"x\",\"env\":{\"\xfe\":\"1\"}}", "env"},
		{"/v1/jobs", "{\"code\":\"x\",\"files\":[{\"name\":\"a\xff\",\"content\":\"\"}]}", "files[0].name"},
		// A lone surrogate escape is decoded to U+FFFD too.
		{"/v1/jobs", `{"code":"print('\ud800')"}`, "code"},
		{"/v1/jobs", `{"code":"print('\udc00\ud83d')"}`, "code"},
		{"/v1/jobs/batch", "{\"jobs\":[{\"code\":\"x\"}],\"callback_url\":\"http://\xff\"}", "callback_url"},
		{"/v1/tool-calls", "{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"run_python\",\"input\":{\"code\":\"\xff\"}}", "input.code"},
	} {
		r := b.do(t, http.MethodPost, tc.path, tc.body)
		p := r.problem(t, http.StatusBadRequest)
		if p.Type != string(job.ProblemMalformedJSON) || p.Field != tc.field || !strings.Contains(p.Detail, "UTF-8") {
			t.Errorf("%s %q: %s; want a 400 naming %s", tc.path, tc.body, r.body, tc.field)
		}
	}
	if n := b.streamMsgs(t); n != 0 {
		t.Fatalf("%d jobs published; want none", n)
	}
	// Valid text, a surrogate pair escaped, is run as sent.
	accepted(t, b.submit(t, `{"code":"print('\ud83d\ude00 é')"}`))

	// In a batch, a job that is not text fails alone.
	r := b.do(t, http.MethodPost, "/v1/jobs/batch", "{\"jobs\":[{\"code\":\"\xff\"},{\"code\":\"print(3)\"}]}")
	var out struct {
		Jobs []batchItem `json:"jobs"`
	}
	r.decode(t, &out)
	if r.StatusCode != 200 || len(out.Jobs) != 2 || out.Jobs[0].Error == nil || out.Jobs[0].Error.Field != "jobs[0].code" || out.Jobs[1].Status != 202 {
		t.Fatalf("batch: %d %s", r.StatusCode, r.body)
	}
}

func TestValidText(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		``: true, `abc`: true, "é": true, `\u00e9`: true, `\ud83d\ude00`: true, `\\ud800`: true, `\"`: true,
		"\xff": false, `\ud800`: false, `\udc00`: false, `\ud800x`: false, `\ud800\u0041`: false, `\ud83d\ude00\udc00`: false,
	} {
		if got := validText([]byte(raw)); got != want {
			t.Errorf("validText(%q) = %v, want %v", raw, got, want)
		}
	}
}
