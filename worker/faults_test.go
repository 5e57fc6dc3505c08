package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Redis restarted without its data while the worker held a job: the job's
// record is gone, so no write of the held job can succeed and clear the
// pause. The PING probe must resume pulls, and the worker must recreate the
// lost record from the message and run the job instead of dropping it.
func TestStoreBackEmptyResumesAndRestoresRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	rt := &testkit.Runtime{Script: testkit.Succeed}
	sig := newSignals()
	b.start(t, rt, func(c *Config) {
		c.Heartbeat = 300 * time.Millisecond
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
		c.Hooks = sig.hooks()
	})
	testkit.Eventually(t, 10*time.Second, "the worker to register", func() bool { return b.up(t) })
	held := b.record(t, "print('held')")
	b.redis.Stop()
	b.publish(t, held)
	of(t, sig.delivered, held.ID, 10*time.Second, "the delivery")
	b.redis.RestartEmpty()
	rec := b.waitTerminal(t, held.ID, 10*time.Second)
	if rec.Status != job.StatusSucceeded {
		t.Fatalf("held job after an empty restart: %+v", rec)
	}
	// A job published after the restart (its record lost as well: written
	// before the restart, so the worker must restore it) runs within seconds.
	lost := b.record(t, "print('lost')")
	b.redis.RestartEmpty()
	start := time.Now()
	b.publish(t, lost)
	rec = b.waitTerminal(t, lost.ID, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Message.Spec.Code != "print('lost')" {
		t.Fatalf("job whose record was lost: %+v", rec)
	}
	t.Logf("job with a lost record ran %v after publish", time.Since(start).Round(time.Millisecond))
	if n := rt.Calls.Load(); n != 2 {
		t.Fatalf("runtime called %d times, want 2", n)
	}
}

// A second worker started with the id of a live worker refuses to start,
// naming the problem, once it has waited for the lease to lapse (IDLease
// and a second, on its clock), and leaves the first one's id lease alone. A
// fast logic test with a scripted runtime; internal/e2e.TestSecondWorkerWithSameIDLeavesFirstsSandbox
// runs it as a second process against real containerd.
func TestSecondWorkerWithLiveIDRefusesToStart(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	b.start(t, &testkit.Runtime{Script: testkit.Succeed}, func(c *Config) { c.ID = "same"; c.IDLease = time.Second })
	testkit.Eventually(t, 10*time.Second, "the first worker to register", func() bool { return b.up(t) })
	clock := testkit.NewClock(time.Time{})
	start := clock.Now()
	w, err := New(Config{ID: "same", Runtime: &testkit.Runtime{Script: testkit.Succeed}, Store: b.store, NATS: b.nc, Queue: b.q,
		IDLease: time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// The second worker's clock runs ahead; the first one's lease, renewed
	// on real time, stays live throughout.
	testkit.Eventually(t, 10*time.Second, "the second worker to give up on the id", func() bool {
		clock.Advance(300 * time.Millisecond)
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if waited := clock.Since(start); waited < 2*time.Second {
		t.Errorf("the second worker gave up after %v on its clock; want IDLease and a second (2s)", waited)
	}
	if !errors.Is(err, cache.ErrWorkerIDInUse) || !strings.Contains(err.Error(), "distinct --id") {
		t.Fatalf("second worker with a live id: %v", err)
	}
	if alive, err := b.store.WorkerAlive(ctx, "same"); err != nil || !alive {
		t.Fatalf("first worker's id lease: alive=%v %v", alive, err)
	}
	id := b.submit(t, "print(1)")
	if rec := b.waitTerminal(t, id, 10*time.Second); rec.Status != job.StatusSucceeded || rec.Result.Worker != "same" {
		t.Fatalf("first worker after the refused start: %+v", rec)
	}
}

// Acceptance: Redis restarted without its data under load. Every job whose
// submission succeeded (record written and message published), before or
// after the restart, ends succeeded; the worker resumes within seconds of
// the restart; nothing is left non-terminal. A fast logic test with a
// scripted runtime; internal/e2e.TestRedisRestartedEmptyUnderRealLoad runs it
// with real sandboxes, submitting through the API.
func TestRedisRestartedEmptyUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		time.Sleep(20 * time.Millisecond)
		return testkit.Succeed(ctx, id, spec)
	}}
	b.start(t, rt, func(c *Config) {
		c.Heartbeat = 300 * time.Millisecond
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
		c.Concurrency = 4
	})
	testkit.Eventually(t, 10*time.Second, "the worker to register", func() bool { return b.up(t) })
	// Completion notices, to tell a job that finished before the restart
	// (its record went with Redis's data) from one that was dropped.
	var finished sync.Map
	var finishedN atomic.Int64
	doneSub, err := b.nc.Subscribe(job.DoneSubjectPrefix+">", func(m *nats.Msg) {
		finished.Store(strings.TrimPrefix(m.Subject, job.DoneSubjectPrefix), true)
		finishedN.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer doneSub.Unsubscribe()

	type sub struct {
		id    string
		after bool // submitted after the restart
	}
	var mu sync.Mutex
	var subs []sub
	var restarted atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			after := restarted.Load()
			spec := job.Spec{Runtime: "python", Code: fmt.Sprintf("print(%d)", i), Limits: job.DefaultLimits}
			m := job.Message{ID: job.NewID(), Spec: spec, Key: job.Key(spec, "sha256:test"), CreatedAt: time.Now()}
			if err := b.store.CreateJob(context.Background(), m); err != nil {
				continue // the API would have answered 503
			}
			data, _ := json.Marshal(m)
			if _, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: job.JobSubject("python"), Data: data,
				Header: nats.Header{job.HeaderMsgID: []string{m.ID}}}); err != nil {
				continue
			}
			mu.Lock()
			subs = append(subs, sub{m.ID, after})
			mu.Unlock()
		}
	}()
	var once sync.Once
	stopLoad := func() { once.Do(func() { close(stop); <-done }) }
	t.Cleanup(stopLoad) // a failed wait below must not leave the load running
	count := func(after bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range subs {
			if s.after == after {
				n++
			}
		}
		return n
	}
	// The load is under way (jobs finished, and more queued and running)
	// when Redis restarts empty, and goes on well after.
	testkit.Eventually(t, 20*time.Second, "40 submissions, 20 finished", func() bool {
		return count(false) >= 40 && finishedN.Load() >= 20
	})
	b.redis.RestartEmpty()
	restartedAt := time.Now()
	restarted.Store(true)
	testkit.Eventually(t, 20*time.Second, "60 submissions after the restart", func() bool { return count(true) >= 60 })
	stopLoad()

	mu.Lock()
	defer mu.Unlock()
	var firstAfter string
	before := 0
	for _, s := range subs {
		if s.after && firstAfter == "" {
			firstAfter = s.id
		}
		if !s.after {
			before++
		}
	}
	if firstAfter == "" || before == 0 {
		t.Fatalf("submissions: %d before the restart, first after: %q", before, firstAfter)
	}
	rec := b.waitTerminal(t, firstAfter, 10*time.Second)
	if rec.FinishedAt == nil {
		t.Fatal("no finished_at")
	}
	t.Logf("%d jobs submitted (%d before the restart); the first one after it finished %v after the restart",
		len(subs), before, rec.FinishedAt.Sub(restartedAt).Round(time.Millisecond))
	if took := rec.FinishedAt.Sub(restartedAt); took > 5*time.Second {
		t.Errorf("worker resumed %v after the restart, want within seconds", took)
	}
	lost := 0
	for _, s := range subs {
		if !s.after {
			if _, err := b.store.GetJob(context.Background(), s.id); errors.Is(err, cache.ErrNotFound) {
				if _, ok := finished.Load(s.id); ok {
					lost++ // finished before the restart: its record went with the data
					continue
				}
			}
		}
		if rec := b.waitTerminal(t, s.id, 20*time.Second); rec.Status != job.StatusSucceeded {
			t.Errorf("job %s (after restart: %v): %s", s.id, s.after, rec.Status)
		}
	}
	t.Logf("%d jobs had finished before the restart (records lost with the data); every other one succeeded", lost)
}
