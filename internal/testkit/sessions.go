package testkit

import (
	"context"
	"fmt"
	"sync"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
)

// Sessions is a Runtime that also hosts sessions, for tests of how the
// worker holds them (the catalog, routing, faults), not of the sandbox: each
// session is a ScriptedSession, an interpreter whose state is the number of
// calls it ran since it started.
type Sessions struct {
	Runtime
	// Exec, when set, runs each call in place of the default (the call
	// succeeds, printing its interpreter's count of calls). It may block,
	// panic or end the interpreter as a test needs.
	Exec func(ctx context.Context, s *ScriptedSession, req sandboxapi.Request) (job.Result, sandboxapi.CallInfo, error)

	mu   sync.Mutex
	open []*ScriptedSession
}

// HostsSessions is true.
func (r *Sessions) HostsSessions() bool { return true }

// OpenSession makes a ScriptedSession.
func (r *Sessions) OpenSession(_ context.Context, o sandboxapi.SessionOptions) (sandboxapi.Session, error) {
	s := &ScriptedSession{ID: o.ID, Tenant: o.Tenant, rt: r, files: map[string]*scriptedFile{}}
	r.mu.Lock()
	r.open = append(r.open, s)
	r.mu.Unlock()
	return s, nil
}

// Opened lists every session box opened so far, closed ones too.
func (r *Sessions) Opened() []*ScriptedSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*ScriptedSession(nil), r.open...)
}

// ScriptedSession is a session's box in a Sessions runtime.
type ScriptedSession struct {
	ID, Tenant string
	rt         *Sessions

	mu     sync.Mutex
	calls  int // calls of the interpreter since it started
	closed bool
	files  map[string]*scriptedFile // its /work (session_files.go)
}

// Calls is how many calls the interpreter ran since it started.
func (s *ScriptedSession) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Closed reports whether the box was closed.
func (s *ScriptedSession) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Exec runs one call: Sessions.Exec, or by default a call that succeeds
// printing the interpreter's count of calls (1 for the first).
func (s *ScriptedSession) Exec(ctx context.Context, req sandboxapi.Request) (job.Result, sandboxapi.CallInfo, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return job.Result{ID: req.ID}, sandboxapi.CallInfo{}, sandboxapi.ErrSessionGone
	}
	s.calls++
	n := s.calls
	s.mu.Unlock()
	info := sandboxapi.CallInfo{Fresh: n == 1}
	if s.rt.Exec != nil {
		res, ci, err := s.rt.Exec(ctx, s, req)
		ci.Fresh = ci.Fresh || info.Fresh
		return res, ci, err
	}
	return job.Result{ID: req.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: fmt.Sprintf("%d\n", n), Image: ScriptedImage}, info, nil
}

// Close ends the box.
func (s *ScriptedSession) Close(context.Context) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Alive reports whether the box is not closed.
func (s *ScriptedSession) Alive() bool { return !s.Closed() }

// Image is ScriptedImage.
func (s *ScriptedSession) Image() job.Image { return ScriptedImage }

// ContainerID names the box after its session.
func (s *ScriptedSession) ContainerID() string { return "scripted-" + s.ID }

// MemoryInUse is nothing.
func (s *ScriptedSession) MemoryInUse() int64 { return 0 }
