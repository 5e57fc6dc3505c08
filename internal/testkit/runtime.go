package testkit

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// ScriptedImage is the image a Runtime reports and Succeed's results carry.
var ScriptedImage = job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}

// NoSandbox answers the optional parts of the worker's sandbox interface
// (worker.Sandboxes) as a backend without them does: no contract beyond the
// image, no health check, no background work, nothing to reap, no
// sessions. A fake embeds it and writes Run, Image and Runtimes (and
// whatever part it fakes).
type NoSandbox struct{}

// RuntimeInfo is unsupported: the worker advertises the image alone.
func (NoSandbox) RuntimeInfo(context.Context, string) (job.RuntimeInfo, error) {
	return job.RuntimeInfo{}, errors.ErrUnsupported
}

// Healthy is unsupported: the worker has no backend to watch.
func (NoSandbox) Healthy(context.Context) error { return errors.ErrUnsupported }

// Start has nothing to start.
func (NoSandbox) Start(context.Context) error { return nil }

// ReapOrphans is unsupported.
func (NoSandbox) ReapOrphans(context.Context, string) (int, error) {
	return 0, errors.ErrUnsupported
}

// ReapJob is unsupported.
func (NoSandbox) ReapJob(context.Context, string, func(string) bool) ([]string, error) {
	return nil, errors.ErrUnsupported
}

// ReapExpired is unsupported.
func (NoSandbox) ReapExpired(context.Context, func(string) bool) ([]string, error) {
	return nil, errors.ErrUnsupported
}

// HostsSessions is false.
func (NoSandbox) HostsSessions() bool { return false }

// OpenSession is unsupported.
func (NoSandbox) OpenSession(context.Context, sandboxapi.SessionOptions) (sandboxapi.Session, error) {
	return nil, errors.ErrUnsupported
}

// Runtime stands in for the sandbox backend (worker.Sandboxes) in tests
// that are about the queue and the stores, not containerd: each Run calls
// Script with the request's id and spec. It serves Names (default: python)
// from ScriptedImage. A test that needs the rest of the request (its output
// sink, its artifact store) wraps Runtime and writes Run.
type Runtime struct {
	NoSandbox
	Script func(ctx context.Context, id string, spec job.Spec) (job.Result, error)
	Names  []string
	Calls  atomic.Int64 // Runs so far
}

// Run counts the call and runs the script.
func (r *Runtime) Run(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
	r.Calls.Add(1)
	return r.Script(ctx, req.ID, req.Spec)
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
