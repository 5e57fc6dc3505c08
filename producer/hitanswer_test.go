package producer

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A hit's answer made from its entry's template is byte for byte the one
// encoding/json writes for the same view, whatever the entry holds.
func TestHitTemplateAnswersAsTheEncoder(t *testing.T) {
	t.Parallel()
	finished := time.Date(2026, 11, 25, 3, 4, 5, 600, time.UTC)
	plain := job.Result{ID: "01a21082-330f-739c-91bd-acb7b35d8d68", Status: job.StatusSucceeded, ExitCode: job.IntPtr(0),
		WallMS: 12, Attempt: 1, Worker: "w-1", QueueMS: 3, StartedAt: &finished, FinishedAt: &finished, TraceID: "abc"}
	plain.SetOutput([]byte("1\n"), nil)

	rich := plain
	rich.Status = job.StatusFailed
	rich.ExitCode = job.IntPtr(1)
	rich.SetOutput([]byte("quotes \" and \\ <b>&amp;</b> é 😀 \x01\x7f\n"), []byte("Traceback ...\nZeroDivisionError\n"))
	rich.StdoutTruncated = true
	rich.Error = job.NewFailure(job.CategoryRuntimeError, "ZeroDivisionError: division by zero")
	rich.Limits = &job.DefaultLimits
	rich.Image = job.Image{Name: "kiln/python:3.13", Digest: "sha256:0123"}
	rich.Redactions = map[string]int{"aws": 2, "github": 1}
	rich.Outputs = []job.Output{{Type: "display", Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"42"`)}}}
	rich.Egress = &job.Egress{}

	binary := plain
	binary.SetOutput([]byte{0xff, 0xfe, 'x'}, nil) // not UTF-8: base64

	at := time.Date(2026, 11, 25, 4, 0, 0, 123456000, time.UTC)
	for name, res := range map[string]job.Result{"plain": plain, "rich": rich, "binary": binary} {
		tmpl := newHitTemplate(res)
		if tmpl == nil {
			t.Fatalf("%s: no template", name)
		}
		for _, trace := range []string{"", "4bf92f3577b34da6a3ce929d0e0e4736"} {
			id := job.NewID()
			view := cacheHitView(res, id, trace, at)
			view.Links = jobLinks(id)
			want, err := marshal(view)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := tmpl.render(nil, id, trace, at)
			if !ok || !bytes.Equal(got, want) {
				t.Fatalf("%s, trace %q:\n got %s\nwant %s", name, trace, got, want)
			}
		}
	}

	// What would need escaping is not rendered.
	if _, ok := newHitTemplate(plain).render(nil, `a"b`, "", at); ok {
		t.Fatal("rendered an id that needs escaping")
	}
}
