package sandboxapi

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"github.com/kilnrun/kiln/job"
)

// ErrSessionUnsupported is OpenSession's answer for a runtime whose sandbox
// cannot host sessions (no box: another isolation, or boxes turned off).
var ErrSessionUnsupported = errors.New("sandbox: this runtime cannot host sessions")

// ErrSessionGone is Exec's answer once the session's box has ended (closed,
// or ended by an anomaly): its state and files are gone with it.
var ErrSessionGone = errors.New("sandbox: the session's box is gone")

// SessionOptions are what a session's box is made for.
type SessionOptions struct {
	// ID names the session (the box's session label).
	ID string
	// Tenant owns the session (and so its box).
	Tenant string
	// Runtime names the language runtime ("python").
	Runtime string
	// MemoryMB caps the session's box, every call together: its cgroup's
	// memory limit. 0: the policy's default job memory limit.
	MemoryMB int64
	// Restore: the session had an incarnation before (it was paused, or its
	// worker was lost), so its interpreter's memory is gone anyway. Unless
	// a box made ahead is ready, its box is made without the runtime's
	// preload: it comes back in a fraction of the time, and its calls
	// import what they use when they use it.
	Restore bool
}

// CallInfo says what a call did to the session's interpreter.
type CallInfo struct {
	// Fresh: this call started the session's interpreter (the session's
	// first call, or the first after the interpreter ended).
	Fresh bool
	// Ended: the interpreter is gone after this call (its memory cap, a
	// timeout it did not yield to, a program that ended its process): the
	// next call starts a fresh one, without the state of the calls before.
	Ended bool
}

// SessionFile is an entry of a session's /work.
type SessionFile struct {
	// Name is the entry's path under /work, slash-separated.
	Name string
	Size int64
	// Mode is the entry's permission bits and, but for a regular file, its
	// type (fs.ModeDir, fs.ModeSymlink).
	Mode    fs.FileMode
	ModTime time.Time
}

// Session is a session's box: its calls run one at a time, in it alone.
type Session interface {
	// Exec runs one call: req.Spec's code in the session's interpreter, its
	// files written to /work first. An error means the call did not run
	// (ErrSessionGone: the box is gone; or the spec is not valid: the
	// result then says so).
	Exec(ctx context.Context, req Request) (job.Result, CallInfo, error)
	// Close removes the box, its interpreter and its files. Calling it
	// again is harmless.
	Close(ctx context.Context)
	// Alive reports whether the box still serves calls.
	Alive() bool
	// Image is the image the session runs.
	Image() job.Image
	// ContainerID names the session's box in its backend.
	ContainerID() string
	// MemoryInUse is what the box's cgroup holds now, in bytes.
	MemoryInUse() int64
	// SessionFiles: its /work, read and changed between calls.
	SessionFiles
}
