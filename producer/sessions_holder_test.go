package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// leaseStore is a SessionStore whose only answer is the worker's lease
// (WorkerInstance): the instance token, "" for none, or an error.
type leaseStore struct {
	SessionStore
	mu   sync.Mutex
	inst string
	err  error
}

func (l *leaseStore) set(inst string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inst, l.err = inst, err
}

func (l *leaseStore) WorkerInstance(context.Context, string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inst, l.err
}

// A live worker's session is not taken from it because the store was
// away: right after an outage its lease may be missing (it lapsed while
// renewals failed) and a loaded worker may answer late. A worker counts as
// gone on a sign of it: no responder on its subject, another process
// holding its id, or its lease missing for SessionWorkerLapse while the
// store answers.
func TestSessionHolderGoneOnlyOnASignOfIt(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	s := &sessions{nc: nc, cfg: &Config{Now: clock, SessionWorkerLapse: 10 * time.Second}}
	st := &leaseStore{}
	rec := cache.SessionRecord{ID: job.NewID(), Worker: "w1", Instance: "w1/1", Status: job.SessionReady}

	// The worker is subscribed but does not answer in time (busy, or a
	// loaded host): each question times out.
	sub, err := nc.Subscribe(job.SessionWorkerPrefix+rec.Worker, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	held := func(what string, want bool) {
		t.Helper()
		got, err := s.holds(t.Context(), st, rec)
		if err != nil || got != want {
			t.Fatalf("%s: held %v, err %v; want held %v", what, got, err, want)
		}
	}

	// Its lease lapsed during the outage and it has not renewed it yet.
	st.set("", nil)
	held("the lease missing right after an outage", true)
	advance(5 * time.Second)
	held("the lease missing for 5s", true)
	// The store goes away again: no answer, and the wait starts over.
	st.set("", cache.ErrUnavailable)
	if _, err := s.holds(t.Context(), st, rec); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("the store away: %v; want its error", err)
	}
	st.set("", nil)
	advance(time.Second)
	held("the lease missing again after another outage", true)
	advance(9 * time.Second)
	held("the lease missing 9s after the store came back", true)
	// Renewed: the worker is alive.
	st.set(rec.Instance, nil)
	advance(time.Second)
	held("the lease renewed", true)
	// A lease missing for a whole SessionWorkerLapse with the store up:
	// a worker that is alive would have re-taken it.
	st.set("", nil)
	advance(time.Second)
	held("the lease missing again", true)
	advance(10 * time.Second)
	held("the lease missing for SessionWorkerLapse", false)
	// Another process took the worker id: this one is gone.
	st.set("w1/2", nil)
	held("the id held by another process", false)

	// The worker answers: its answer decides, whatever the lease says.
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	sub, err = nc.Subscribe(job.SessionWorkerPrefix+rec.Worker, func(m *nats.Msg) { _ = m.Respond([]byte(job.SessionHeld)) })
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	st.set("", nil)
	held("the worker says it holds the session", true)

	// No one on the worker's subject: the process is gone.
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	st.set(rec.Instance, nil)
	held("no responder", false)
}

// callStore is a SessionStore whose call is queued; once the call's session
// says it changed, the caller goes away (leave) while the call is read,
// and the read answers the caller's context's end.
type callStore struct {
	SessionStore
	reads int
	leave context.CancelFunc
}

func (c *callStore) SessionCall(ctx context.Context, id string, seq int64) (cache.SessionCallRecord, error) {
	c.reads++
	if c.reads == 1 {
		return cache.SessionCallRecord{State: job.CallQueued}, nil
	}
	c.leave()
	<-ctx.Done()
	return cache.SessionCallRecord{}, fmt.Errorf("get call: %w", ctx.Err())
}

// A caller that goes away while its accepted call is read learns where the
// call stands, with its seq: a caller that withdraws its call on leaving
// (e2bapi's execution) needs the seq, where a store error would lose it.
func TestCallWaitOfACallerGoneKeepsTheSeq(t *testing.T) {
	t.Parallel()
	s := &sessions{waits: &waits{done: t.Context()}, problems: &problems{log: slog.New(slog.DiscardHandler)}}
	done := make(chan *nats.Msg, 1)
	done <- &nats.Msg{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := &callStore{leave: cancel}
	ans, p := s.awaitCall(ctx, st, job.NewID(), 7, time.Minute, done)
	if p != nil || ans.pending == nil || ans.pending.Seq != 7 || ans.pending.Status != job.CallQueued {
		t.Fatalf("awaitCall of a caller gone: %+v, %v; want call 7 pending, queued", ans.pending, p)
	}
	if st.reads != 2 {
		t.Fatalf("the call was read %d times; want twice (the caller left during the second)", st.reads)
	}
}
