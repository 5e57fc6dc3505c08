package worker

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A stream over job.MaxInlineOutputBytes is recorded as a reference to the
// object store holding its exact bytes; a shorter one stays inline.
func TestLongOutputIsKeptInTheObjectStore(t *testing.T) {
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	ctx := context.Background()
	long := append(bytes.Repeat([]byte{1}, job.MaxInlineOutputBytes), 0xff) // one byte over, not UTF-8
	rt := &testkit.Runtime{Script: func(context.Context, string, job.Spec) (job.Result, error) {
		r := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), StdoutBytes: int64(len(long)),
			Image: job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}}
		r.SetOutput(long, []byte("short\n"))
		return r, nil
	}}
	b.start(t, rt, nil)
	id := b.submit(t, "print(1)")
	rec := b.waitTerminal(t, id, 10*time.Second)
	res := rec.Result
	if res == nil || res.StdoutObject == nil || res.Stdout != "" || res.StdoutBase64 != "" {
		t.Fatalf("long stdout not kept in the object store: %+v", res)
	}
	if res.StderrObject != nil || res.Stderr != "short\n" {
		t.Fatalf("short stderr not inline: %+v", res)
	}
	if res.StdoutObject.UTF8 || res.StdoutObject.Size != int64(len(long)) {
		t.Fatalf("object reference: %+v", res.StdoutObject)
	}
	o, err := blob.New(b.js, blob.Config{}).Open(ctx, res.StdoutObject.ObjectRef)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	got, err := io.ReadAll(o)
	if err != nil || !bytes.Equal(got, long) {
		t.Fatalf("stored stdout: %d bytes, equal %v, err %v", len(got), bytes.Equal(got, long), err)
	}
}
