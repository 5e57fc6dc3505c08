package worker

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// openTestSession records a session of tenant and has the fleet hold it,
// as the API does; it returns the session's id.
func (b *bundle) openTestSession(t *testing.T, tenant string) string {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	rec := cache.SessionRecord{ID: job.NewID(), Tenant: tenant, Runtime: "python", Created: now, Expires: now.Add(time.Hour),
		IdleTimeout: time.Hour, MemoryMB: 256, Limits: job.DefaultLimits, Restore: job.RestoreFiles}
	if err := b.store.CreateSession(ctx, rec, 10); err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(job.SessionOpen{ID: rec.ID, Tenant: tenant, MemoryMB: rec.MemoryMB})
	var msg *nats.Msg
	var err error
	// A worker just started may not listen yet.
	if !testkit.Poll(20*time.Second, func() bool {
		msg, err = b.nc.Request(job.SessionOpenPrefix+"python", req, 20*time.Second)
		return err != nats.ErrNoResponders
	}) || err != nil {
		t.Fatalf("open session: %v", err)
	}
	var got job.SessionOpened
	if err := json.Unmarshal(msg.Data, &got); err != nil || got.Error != "" {
		t.Fatalf("open session: %s %v", msg.Data, err)
	}
	return rec.ID
}

// call accepts a call of the session, tells its holder, and returns its seq
// and a channel of the session's done notices.
func (b *bundle) call(t *testing.T, tenant, id, code string) int64 {
	t.Helper()
	ctx := context.Background()
	seq, _, err := b.store.EnqueueCall(ctx, tenant, id, job.SessionCall{Code: code, EventsID: job.NewID()}, "", 16, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.store.Session(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(id)); err != nil {
		t.Fatal(err)
	}
	return seq
}

// callDone waits for the call's result in the catalog.
func (b *bundle) callDone(t *testing.T, id string, seq int64, within time.Duration) job.CallResult {
	t.Helper()
	var got cache.SessionCallRecord
	if !testkit.Poll(within, func() bool {
		var err error
		got, err = b.store.SessionCall(context.Background(), id, seq)
		return err == nil && got.Result != nil
	}) {
		t.Fatalf("call %d of session %s has no result within %v (state %q)", seq, id, within, got.State)
	}
	return *got.Result
}

// A store outage while a session's call runs delays its answer; it loses
// neither the call nor the interpreter: the worker keeps the result and
// records it once the store is back, the same box serves the next call
// (its interpreter's count goes on), and no incarnation is spent.
func TestSessionCallSurvivesAStoreOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	running, release := make(chan struct{}), make(chan struct{})
	rt := &testkit.Sessions{}
	rt.Exec = func(ctx context.Context, s *testkit.ScriptedSession, req sandboxapi.Request) (job.Result, sandboxapi.CallInfo, error) {
		if strings.Contains(req.Spec.Code, "slow") {
			close(running)
			<-release
		}
		return job.Result{ID: req.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: strconv.Itoa(s.Calls()) + "\n"}, sandboxapi.CallInfo{}, nil
	}
	refused := make(chan struct{}, 64)
	b.start(t, rt, func(c *Config) { c.Store = finishWatch{b.store, refused} })
	id := b.openTestSession(t, "acme")
	first := b.call(t, "acme", id, "x = 1")
	if r := b.callDone(t, id, first, 10*time.Second); r.Status != job.StatusSucceeded || r.Stdout != "1\n" {
		t.Fatalf("first call: %+v", r.Result)
	}
	slow := b.call(t, "acme", id, "slow()")
	testkit.Closed(t, running, 10*time.Second, "the slow call to run")
	b.redis.Stop()
	close(release)
	// The call has ended; its result cannot be recorded while Redis is
	// down. The box must not be closed for it.
	testkit.Receive(t, refused, 10*time.Second, "a refused write of the call's result")
	b.redis.Start()
	r := b.callDone(t, id, slow, 30*time.Second)
	if r.Status != job.StatusSucceeded || r.Stdout != "2\n" || !r.StateRestored {
		t.Fatalf("the call that ended during the outage: %+v (state restored %v, note %q)", r.Result, r.StateRestored, r.SessionNote)
	}
	third := b.call(t, "acme", id, "x")
	r3 := b.callDone(t, id, third, 10*time.Second)
	if r3.Stdout != "3\n" || r3.Incarnation != r.Incarnation || !r3.StateRestored {
		t.Fatalf("the call after the outage: %q incarnation %d (before %d), state restored %v: the interpreter was lost", r3.Stdout, r3.Incarnation, r.Incarnation, r3.StateRestored)
	}
	if opened := rt.Opened(); len(opened) != 1 || opened[0].Closed() {
		t.Fatalf("%d boxes opened (first closed: %v); want the one box, kept", len(opened), opened[0].Closed())
	}
}

// A panic in the worker while it handles a session's call fails that call
// alone: it is answered internal_error, the session's next call runs in the
// same interpreter, and a job running beside it on the worker finishes.
func TestSessionCallPanicFailsOnlyItsCall(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	jobRunning, releaseJob := make(chan struct{}), make(chan struct{})
	rt := &testkit.Sessions{Runtime: testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		close(jobRunning)
		<-releaseJob
		return testkit.Succeed(ctx, id, spec)
	}}}
	rt.Exec = func(ctx context.Context, s *testkit.ScriptedSession, req sandboxapi.Request) (job.Result, sandboxapi.CallInfo, error) {
		if req.Spec.Code == "boom" {
			var m map[string]int
			m["boom"]++ // a nil map write: a real runtime panic
		}
		return job.Result{ID: req.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: strconv.Itoa(s.Calls()) + "\n"}, sandboxapi.CallInfo{}, nil
	}
	stop := b.start(t, rt, nil)
	jobID := b.submit(t, "print(1)")
	testkit.Closed(t, jobRunning, 10*time.Second, "the job to run")
	id := b.openTestSession(t, "acme")
	boom := b.call(t, "acme", id, "boom")
	r := b.callDone(t, id, boom, 10*time.Second)
	if r.Status != job.StatusInternalError || r.Error == nil || !strings.Contains(r.Error.Message, "panic") {
		t.Fatalf("the call that panicked: %+v", r.Result)
	}
	next := b.call(t, "acme", id, "x")
	if r := b.callDone(t, id, next, 10*time.Second); r.Status != job.StatusSucceeded || r.Stdout != "2\n" {
		t.Fatalf("the call after the panic: %+v; want the same interpreter's second call", r.Result)
	}
	close(releaseJob)
	if rec := b.waitTerminal(t, jobID, 10*time.Second); rec.Status != job.StatusSucceeded {
		t.Fatalf("the job beside the panic: %s", rec.Status)
	}
	stop() // Run returns nil: the worker survived
}

// Asked whether it holds a session (a request on its subject), the holder
// answers held; a worker without it answers nothing, so the API can tell a
// live holder whose lease lapsed in a store outage from a lost one.
func TestSessionHolderAnswersWhetherItHoldsTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.start(t, &testkit.Sessions{}, nil)
	id := b.openTestSession(t, "acme")
	rec, err := b.store.Session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(session string) string {
		t.Helper()
		msg, err := b.nc.Request(job.SessionWorkerPrefix+rec.Worker, []byte(session), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(msg.Data)
	}
	if got := ask(id); got != job.SessionHeld {
		t.Fatalf("the holder answered %q for its session", got)
	}
	if got := ask(job.NewID()); got != "" {
		t.Fatalf("the holder answered %q for a session it does not hold", got)
	}
	_, err = b.nc.Request(job.SessionWorkerPrefix+"no-such-worker", []byte(id), time.Second)
	if err != nats.ErrNoResponders {
		t.Fatalf("a worker that is gone: %v, want no responders", err)
	}
}

// finishWatch is the real store, signalling each call result it could not
// record.
type finishWatch struct {
	*cache.Store
	refused chan struct{}
}

func (s finishWatch) FinishCall(ctx context.Context, id string, h cache.SessionHolder, seq int64, res job.CallResult, idleUntil time.Time, files []job.SessionFileEntry, fresh bool, note string) error {
	err := s.Store.FinishCall(ctx, id, h, seq, res, idleUntil, files, fresh, note)
	if err != nil {
		select {
		case s.refused <- struct{}{}:
		default:
		}
	}
	return err
}

// Paused, a session holds no box and no place among its tenant's live
// sessions; resumed, it comes back in a new box with its files, says so
// (restored: files), and its next call finds a fresh interpreter with a
// note that says it was paused. Idle past its idle timeout, a session
// pauses by itself.
func TestSessionPausesAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	rt := &testkit.Sessions{}
	b.start(t, rt, func(c *Config) { c.Sessions.Poll = 50 * time.Millisecond })
	ctx := context.Background()
	id := b.openTestSession(t, "acme")
	first := b.call(t, "acme", id, "x = 1")
	if r := b.callDone(t, id, first, 10*time.Second); r.Stdout != "1\n" {
		t.Fatalf("first call: %+v", r.Result)
	}
	paused, err := b.store.RequestPause(ctx, "acme", id)
	if err != nil || paused {
		t.Fatalf("request pause: %v %v", paused, err)
	}
	rec := b.session(t, id)
	if err := b.nc.Publish(job.SessionWorkerPrefix+rec.Worker, []byte(id)); err != nil {
		t.Fatal(err)
	}
	rec = b.sessionWhen(t, id, func(r cache.SessionRecord) bool { return r.Status == job.SessionPaused })
	if rec.Worker != "" || rec.PausedAt.IsZero() {
		t.Fatalf("paused record: worker %q paused at %v", rec.Worker, rec.PausedAt)
	}
	testkit.Eventually(t, 10*time.Second, "the paused session's box to be closed", func() bool { return rt.Opened()[0].Closed() })
	if live, err := b.store.TenantSessions(ctx, "acme", time.Now()); err != nil || len(live) != 1 {
		t.Fatalf("the tenant's sessions while paused: %d %v; want the paused one listed", len(live), err)
	}

	// A call resumes it (the API resumes, then asks a worker to hold it).
	if resumed, err := b.store.Resume(ctx, "acme", id, 10, time.Now()); err != nil || !resumed {
		t.Fatalf("resume: %v %v", resumed, err)
	}
	b.holdTestSession(t, id)
	rec = b.session(t, id)
	if rec.Status != job.SessionReady || rec.Restored != job.RestoredFiles {
		t.Fatalf("resumed: status %q restored %q", rec.Status, rec.Restored)
	}
	next := b.call(t, "acme", id, "x")
	r := b.callDone(t, id, next, 10*time.Second)
	if r.StateRestored || !strings.Contains(r.SessionNote, "paused") || r.Stdout != "1\n" || r.Incarnation != rec.Inc {
		t.Fatalf("the call after the resume: %+v state_restored %v note %q incarnation %d (record %d)", r.Result, r.StateRestored, r.SessionNote, r.Incarnation, rec.Inc)
	}
	if n := len(rt.Opened()); n != 2 {
		t.Fatalf("%d boxes opened; want a new one for the resume", n)
	}

	// Idle: a session whose idle deadline passed pauses by itself.
	idle := b.openTestSession(t, "acme")
	if err := b.store.FinishCall(ctx, idle, b.holderOf(t, idle), 0, job.CallResult{}, time.Now().Add(-time.Second), nil, false, ""); err != nil {
		t.Fatal(err)
	}
	b.sessionWhen(t, idle, func(r cache.SessionRecord) bool { return r.Status == job.SessionPaused })
}

// session reads a session's record.
func (b *bundle) session(t *testing.T, id string) cache.SessionRecord {
	t.Helper()
	rec, err := b.store.Session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// sessionWhen waits until the session's record satisfies cond.
func (b *bundle) sessionWhen(t *testing.T, id string, cond func(cache.SessionRecord) bool) cache.SessionRecord {
	t.Helper()
	var rec cache.SessionRecord
	testkit.Eventually(t, 10*time.Second, "session "+id+"'s record to change", func() bool {
		var err error
		rec, err = b.store.Session(context.Background(), id)
		return err == nil && cond(rec)
	})
	return rec
}

// holderOf is the holder the session's record names.
func (b *bundle) holderOf(t *testing.T, id string) cache.SessionHolder {
	rec := b.session(t, id)
	return cache.SessionHolder{Worker: rec.Worker, Instance: rec.Instance, Inc: rec.Inc}
}

// holdTestSession asks the fleet to hold a session that exists (a resumed
// one), as the API does.
func (b *bundle) holdTestSession(t *testing.T, id string) {
	t.Helper()
	rec := b.session(t, id)
	req, _ := json.Marshal(job.SessionOpen{ID: id, Tenant: rec.Tenant, MemoryMB: rec.MemoryMB})
	msg, err := b.nc.Request(job.SessionOpenPrefix+"python", req, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got job.SessionOpened
	if err := json.Unmarshal(msg.Data, &got); err != nil || got.Error != "" {
		t.Fatalf("hold session: %s %v", msg.Data, err)
	}
}
