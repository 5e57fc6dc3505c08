package worker

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// A job whose record Redis lost while its message was queued (a failover to
// a lagging replica) is restored from the message and runs; one whose
// record's lifetime is over is dropped unrun. (internal/e2e.TestRedisRestartedEmptyUnderRealLoad
// covers restored records end to end, with real sandboxes.)
func TestLostRecordIsRestoredFromTheMessage(t *testing.T) {
	b := setup(t, queue.Config{AckWait: time.Second})
	ctx := context.Background()
	publish := func(createdAt time.Time) string {
		spec := job.Spec{Runtime: "python", Code: "print(1)", Limits: job.DefaultLimits}
		m := job.Message{ID: job.NewID(), Spec: spec, Key: job.Key(spec, "sha256:test"), CreatedAt: createdAt}
		data, _ := json.Marshal(m)
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: job.JobSubject("python"), Data: data,
			Header: nats.Header{job.HeaderMsgID: []string{m.ID}}}); err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	lost := publish(time.Now()) // queued, its record never reached the server now primary
	expired := publish(time.Now().Add(-25 * time.Hour))
	rt := &testkit.Runtime{Script: testkit.Succeed}
	sig := newSignals()
	b.start(t, rt, func(c *Config) { c.Hooks = sig.hooks() })
	rec := b.waitTerminal(t, lost, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Stdout != "ok\n" {
		t.Fatalf("restored job: %+v", rec)
	}
	of(t, sig.acked, lost, 10*time.Second, "the ack")
	of(t, sig.terminated, expired, 10*time.Second, "the expired job's message dropped")
	if ack, pending := b.pending(t); ack != 0 || pending != 0 {
		t.Fatalf("%d messages unacked, %d pending; want none", ack, pending)
	}
	if _, err := b.store.GetJob(ctx, expired); err == nil {
		t.Error("a record was re-created for a job past its lifetime")
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Errorf("%d runs; want the restored job's only", n)
	}
}

// Redis restarted empty while a job ran: the run's result is recorded on a
// record restored from the message, and the job's code is not run again.
func TestResultOfAJobWhoseRecordWentMissingIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		once.Do(func() { close(running) })
		<-release
		return testkit.Succeed(ctx, id, spec)
	}}
	sig := newSignals()
	b.start(t, rt, func(c *Config) {
		c.Heartbeat = 300 * time.Millisecond
		c.StoreProbe = 100 * time.Millisecond
		c.IDLease = time.Second
		c.Hooks = sig.hooks()
	})
	testkit.Eventually(t, 10*time.Second, "the worker to register", func() bool { return b.up(t) })
	id := b.submit(t, "print('once')")
	testkit.Closed(t, running, 10*time.Second, "the job's run")
	b.redis.RestartEmpty()
	close(release)
	rec := b.waitTerminal(t, id, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Attempt != 1 || rec.Message.Spec.Code != "print('once')" {
		t.Fatalf("after the record went missing mid-run: %s attempt %d %+v", rec.Status, rec.Result.Attempt, rec.Message.Spec)
	}
	// Acked: the job can never run again. (Handed back instead, it would
	// have run again before any ack, its record gone.)
	if e := of(t, sig.acked, id, 10*time.Second, "the ack"); e.Attempt != 1 {
		t.Fatalf("acked on attempt %d, want the first", e.Attempt)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("runtime called %d times, want 1", n)
	}
}
