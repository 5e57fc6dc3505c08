package worker

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// With MinReplicas 1 and the replica cut off, a job runs and its result is
// readable on the primary, but its message is held (not acked, not
// redelivered) for as long as no replica holds the result, across a worker
// that stops while waiting; once the replica is back, the message is acked
// and the job has run once.
func TestMessageIsAckedOnlyOnceAReplicaHoldsTheResult(t *testing.T) {
	t.Parallel()
	ha := testenv.StartRedisPair(t)
	ctx := context.Background()
	const ackWait = time.Second
	b := setupWithStore(t, queue.Config{AckWait: ackWait}, cache.Config{
		URL: "redis://" + ha.ServerAddr(0) + "/0", MinReplicas: 1, ReplicaWait: 100 * time.Millisecond})
	replica, err := cache.New(ctx, cache.Config{URL: "redis://" + ha.ServerAddr(1) + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Close() })
	if err := ha.CutReplica(ctx); err != nil {
		t.Fatal(err)
	}
	rt := &testkit.Runtime{Script: testkit.Succeed}
	sig1, sig2 := newSignals(), newSignals()
	stop1 := b.start(t, rt, func(c *Config) { c.ID = "w-durable-1"; c.DrainTimeout = 500 * time.Millisecond; c.Hooks = sig1.hooks() })
	id := b.submit(t, "print(1)")
	// Its completion is announced only once a replica holds it: read the
	// primary.
	var rec cache.Record
	testkit.Eventually(t, 10*time.Second, "the result on the primary", func() bool {
		var err error
		rec, err = b.store.GetJob(ctx, id)
		return err == nil && rec.Status.Terminal()
	})
	if rec.Status != job.StatusSucceeded {
		t.Fatalf("result on the primary: %+v", rec)
	}
	held := func(why string, sig *signals) {
		t.Helper()
		// Over twice AckWait: a lapsed heartbeat would redeliver.
		testkit.Quiet(t, sig.delivered, 5*ackWait/2, why+": a redelivery")
		if ack, pending := b.pending(t); ack != 1 || pending != 0 {
			t.Fatalf("%s: %d messages ack-pending, %d pending; want the job's message held", why, ack, pending)
		}
		if n := rt.Calls.Load(); n != 1 {
			t.Fatalf("%s: %d runs; want 1", why, n)
		}
	}
	of(t, sig1.delivered, id, 10*time.Second, "the delivery")
	held("replica cut off", sig1)
	if rec, err := replica.GetJob(ctx, id); err == nil && rec.Status.Terminal() {
		t.Fatalf("replica's record is %q; want it behind (the job was submitted after the cut)", rec.Status)
	}

	// The worker stops while it waits: its grace period ends and it hands the
	// message back; the next worker finds the result and holds it the same way.
	stop1()
	of(t, sig1.handedBack, id, 10*time.Second, "the stopping worker handing the job back")
	b.start(t, rt, func(c *Config) { c.ID = "w-durable-2"; c.Hooks = sig2.hooks() })
	if e := of(t, sig2.delivered, id, 10*time.Second, "the next worker's delivery"); e.Attempt != 2 {
		t.Fatalf("the next worker took delivery %d, want 2", e.Attempt)
	}
	held("after a worker stopped while waiting", sig2)

	if err := ha.ReconnectReplica(ctx); err != nil {
		t.Fatal(err)
	}
	of(t, sig2.acked, id, 20*time.Second, "the ack once the replica came back")
	if ack, pending := b.pending(t); ack != 0 || pending != 0 {
		t.Fatalf("after the ack: %d unacked, %d pending", ack, pending)
	}
	if rec, err := replica.GetJob(ctx, id); err != nil || rec.Status != job.StatusSucceeded {
		t.Fatalf("replica's record after the ack: %q, %v; want succeeded", rec.Status, err)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("%d runs; want 1", n)
	}
}

// A record that vanished while its job ran (a failover to a replica that
// had not received it) is restored from the message and the result in hand
// is written: the job does not run again.
func TestRecordLostDuringTheRunIsRestoredWithTheResult(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	raw := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	t.Cleanup(func() { raw.Close() })
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		if err := raw.Del(ctx, cache.PrefixDefault+"job:"+id).Err(); err != nil {
			return job.Result{}, err
		}
		return testkit.Succeed(ctx, id, spec)
	}}
	sig := newSignals()
	b.start(t, rt, func(c *Config) { c.Hooks = sig.hooks() })
	id := b.submit(t, "print(1)")
	rec := b.waitTerminal(t, id, 10*time.Second)
	if rec.Status != job.StatusSucceeded || rec.Result.Stdout != "ok\n" || rec.Message.ID != id {
		t.Fatalf("record: %+v", rec)
	}
	if e := of(t, sig.acked, id, 10*time.Second, "the ack"); e.Attempt != 1 {
		t.Fatalf("acked on attempt %d, want the first", e.Attempt)
	}
	if ack, pending := b.pending(t); ack != 0 || pending != 0 {
		t.Fatalf("after the ack: %d unacked, %d pending", ack, pending)
	}
	if n := rt.Calls.Load(); n != 1 {
		t.Fatalf("%d runs; want 1 (the result in hand is written, not the job run again)", n)
	}
}
