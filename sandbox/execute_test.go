package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/artifacts"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// fakeTarget is a run whose delivery and watch succeed or fail as told, as
// each kind of target can.
type fakeTarget struct {
	sb                   *sandbox
	deliverErr, watchErr error
	exit                 int
	delivered, finished  int
}

func (f *fakeTarget) sandbox() *sandbox { return f.sb }
func (f *fakeTarget) listen(context.Context) (net.Listener, error) {
	return nil, errors.New("no network")
}
func (f *fakeTarget) started() bool                 { return true }
func (f *fakeTarget) deliver(context.Context) error { f.delivered++; return f.deliverErr }
func (f *fakeTarget) watch(_ context.Context, _ job.Limits, e ending) (ending, error) {
	e.Init = &initproto.Status{Ready: true, ExitCode: f.exit}
	return e, f.watchErr
}
func (f *fakeTarget) finish(context.Context, *job.Result, *ending) (artifacts.OutputStream, time.Duration) {
	f.finished++
	return artifacts.OutputStream{}, 0
}

// Every run execute is given is judged exactly once when it ends, and not
// at all when the platform failed before it could be (the caller then maps
// the fault); what the run left is collected once, before the judgement.
func TestExecuteJudgesEveryRunOnce(t *testing.T) {
	t.Parallel()
	judged := map[string]int{}
	r := &executor{tracer: tracenoop.NewTracerProvider().Tracer(""), log: slog.New(slog.DiscardHandler),
		judged: func(id string) { judged[id]++ }}
	lim := job.DefaultLimits
	for _, c := range []struct {
		name    string
		target  *fakeTarget
		status  job.Status
		judged  int
		failErr bool
	}{
		{"a run that exits 0", &fakeTarget{}, job.StatusSucceeded, 1, false},
		{"a run that exits 3", &fakeTarget{exit: 3}, job.StatusFailed, 1, false},
		{"a delivery the platform failed", &fakeTarget{deliverErr: errors.New("socket closed")}, "", 0, true},
		{"a watch the platform failed", &fakeTarget{watchErr: errors.New("containerd gone")}, "", 0, true},
	} {
		c.target.sb = &sandbox{id: "box", stdout: newCappedBuffer(1 << 10), stderr: newCappedBuffer(1 << 10)}
		id := job.NewID()
		req := Request{ID: id, Spec: job.Spec{Runtime: "python", Code: "print(1)"}}
		res, err := r.execute(t.Context(), c.target, req, lim, job.Result{ID: id}, ending{Timeout: time.Second})
		if (err != nil) != c.failErr || res.Status != c.status || judged[id] != c.judged {
			t.Errorf("%s: status %q err %v judged %d times; want %q, error %v, judged %d", c.name, res.Status, err, judged[id], c.status, c.failErr, c.judged)
		}
		if c.target.delivered != 1 || c.target.finished != c.judged {
			t.Errorf("%s: delivered %d, finished %d times", c.name, c.target.delivered, c.target.finished)
		}
	}
}

// A job in a container of its own, a job in a box and a session's call all
// go through execute: each run is judged there once.
func TestEveryKindOfRunIsJudgedOnceByExecute(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	judged := map[string]int{}
	count := func(rt *Containerd) {
		rt.exec.judged = func(id string) { mu.Lock(); judged[id]++; mu.Unlock() }
	}
	run := func(rt *Containerd, kind string) {
		t.Helper()
		id := job.NewID()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		res, err := rt.Run(ctx, Request{ID: id, Spec: py("print(1)")})
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("%s: %s %+v %v", kind, res.Status, res.Error, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if judged[id] != 1 {
			t.Errorf("%s: judged %d times by execute, want once", kind, judged[id])
		}
	}
	container := setupWith(t, func(c *Config) { c.Boxes.Off = true; c.Pool = PoolConfig{} })
	count(container)
	run(container, "a container of its own")
	if !underGVisor() {
		boxes := setupBoxes(t, BoxConfig{Max: 2})
		count(boxes)
		run(boxes, "a box's job")
		sessions := setupSessions(t)
		count(sessions)
		s := openSession(t, sessions, "acme", 0)
		id := job.NewID()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		res, _, err := s.Exec(ctx, Request{ID: id, Spec: py("x = 1\nprint(x)")})
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("session call: %s %+v %v", res.Status, res.Error, err)
		}
		mu.Lock()
		if judged[id] != 1 {
			t.Errorf("a session's call: judged %d times by execute, want once", judged[id])
		}
		mu.Unlock()
	}
}
