package testkit

import (
	"context"
	"sync/atomic"

	"github.com/kilnrun/kiln/job"
)

// ScriptedImage is the image a Runtime reports and Succeed's results carry.
var ScriptedImage = job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}

// Runtime stands in for the sandbox runtime (worker.Runtime) in tests that
// are about the queue and the stores, not containerd: each Run calls
// Script. It serves Names (default: python) from ScriptedImage.
type Runtime struct {
	Script func(ctx context.Context, id string, spec job.Spec) (job.Result, error)
	Names  []string
	Calls  atomic.Int64 // Runs so far
}

// Run counts the call and runs the script.
func (r *Runtime) Run(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
	r.Calls.Add(1)
	return r.Script(ctx, id, spec)
}

// Image is ScriptedImage for every runtime.
func (r *Runtime) Image(context.Context, string) (job.Image, error) { return ScriptedImage, nil }

// Runtimes is Names, or python alone.
func (r *Runtime) Runtimes() []string {
	if len(r.Names) == 0 {
		return []string{"python"}
	}
	return r.Names
}

// Succeed is a script whose every job exits 0 printing "ok".
func Succeed(context.Context, string, job.Spec) (job.Result, error) {
	return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "ok\n", Image: ScriptedImage}, nil
}
