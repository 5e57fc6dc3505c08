package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// maxSpec is a job with code, stdin, files, args and env each at its
// documented maximum; its program prints what it received.
func maxSpec() job.Spec {
	prog := `
import os, sys
code = os.path.getsize(os.path.abspath(sys.argv[0]))
stdin = len(sys.stdin.buffer.read())
files = sum(os.path.getsize("in/f%d" % i) for i in range(4))
args = sys.argv[1:]
env = [k for k in os.environ if k.startswith("E_")]
print(code, stdin, files, len(args), sum(map(len, args)), len(env), sum(len(k) + len(os.environ[k]) for k in env))
#`
	spec := job.Spec{Runtime: "python", Code: prog + strings.Repeat("c", job.MaxCodeBytes-len(prog)-1) + "\n",
		Stdin: strings.Repeat("s", job.MaxStdinBytes), Env: map[string]string{}, Cache: job.CacheOff()}
	for i := range 4 {
		spec.Files = append(spec.Files, job.File{Name: fmt.Sprintf("in/f%d", i), Content: strings.Repeat("f", job.MaxFilesBytes/4)})
	}
	for range job.MaxArgs {
		spec.Args = append(spec.Args, strings.Repeat("a", job.MaxArgBytes/job.MaxArgs))
	}
	for i := range job.MaxEnvVars {
		k := fmt.Sprintf("E_%02d", i)
		spec.Env[k] = strings.Repeat("e", job.MaxEnvBytes/job.MaxEnvVars-len(k))
	}
	return spec
}

// Every documented input limit, at its maximum, runs through the pipeline
// (the spec, too large for one NATS message, goes by reference through the
// object store); one byte over any of them is refused naming the field.
func TestInputLimitsEndToEnd(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-limits", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	spec := maxSpec()
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d %d %d %d %d %d %d\n", job.MaxCodeBytes, job.MaxStdinBytes, job.MaxFilesBytes,
		job.MaxArgs, job.MaxArgBytes, job.MaxEnvVars, job.MaxEnvBytes)
	if v.Status != job.StatusSucceeded || v.Stdout != want {
		t.Fatalf("job at the maxima: %s stdout %q want %q; stderr %.500s; error %+v", v.Status, v.Stdout, want, v.Stderr, v.Error)
	}
	rec, err := e.store.GetJob(ctx, sub.ID)
	if err != nil || rec.Message.SpecRef == nil {
		t.Errorf("the spec did not go by reference: %+v %v", rec.Message.SpecRef, err)
	}

	over := map[string]func(*job.Spec){
		"code":  func(s *job.Spec) { s.Code += "#" },
		"stdin": func(s *job.Spec) { s.Stdin += "s" },
		"files": func(s *job.Spec) { s.Files[0].Content += "f" },
		"args":  func(s *job.Spec) { s.Args[0] += "a" },
		"env":   func(s *job.Spec) { s.Env["E_00"] += "e" },
	}
	for field, bump := range over {
		s := maxSpec()
		bump(&s)
		_, err := e.api.Submit(ctx, s)
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || (apiErr.Status != http.StatusUnprocessableEntity && apiErr.Status != http.StatusRequestEntityTooLarge) ||
			!strings.HasPrefix(apiErr.Field, field) {
			t.Errorf("%s one byte over: %v; want 413/422 naming %s", field, err, field)
		}
	}
	// A body past the request limit: 413 naming it.
	s := maxSpec()
	s.Files = append(s.Files, job.File{Name: "big", Content: strings.Repeat("x", job.MaxSpecJSONSize)})
	_, err = e.api.Submit(ctx, s)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusRequestEntityTooLarge || apiErr.Limit != job.MaxSpecJSONSize {
		t.Errorf("body over %d bytes: %v; want 413 with the limit", job.MaxSpecJSONSize, err)
	}
}
