package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// Acceptance 8: Kiln on Redis behind three Sentinels. Under a load of 500
// jobs the replica is cut off (a replica lagging behind), so for a second
// the primary acknowledges writes that reach no replica; then the primary is
// SIGKILLed and the Sentinels promote the replica, which lacks that
// second's writes. Jobs whose record vanished with it while their message
// was queued are restored from the message by a worker and run; the test
// reports the figures and fails on any job left non-terminal.
func TestRedisSentinelFailover(t *testing.T) {
	n := loadJobs(t)
	ha := testenv.StartRedisHA(t)
	ctx := context.Background()
	store, err := cache.New(ctx, cache.Config{SentinelAddrs: ha.SentinelAddrs(), SentinelMaster: testenv.SentinelMaster})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ns := testenv.StartNATS(t)
	q := queue.Config{AckWait: 2 * time.Second, MaxDeliver: 5}
	// 20 jobs a second run while 40 are submitted: a backlog builds, so jobs
	// submitted in the replication window are still queued at the failover.
	p := startPipeline(t, ns.URL(), store, q, 2, 1, 100*time.Millisecond)

	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }
	var failover time.Duration
	ranBefore := map[string]int{} // runs per job when the failover ended
	vanished := map[string]bool{} // accepted jobs the new primary had no record of then
	chaos := make(chan struct{})
	go func() {
		defer close(chaos)
		for p.runs.n.Load() < int64(n/5) && time.Since(start) < 2*time.Minute {
			time.Sleep(50 * time.Millisecond)
		}
		if err := ha.CutReplica(ctx); err != nil {
			t.Errorf("cut the replica off: %v", err)
			return
		}
		t.Logf("%v: %d runs; replica cut off, the primary's writes reach no replica", since(), p.runs.n.Load())
		time.Sleep(time.Second)
		ha.KillServer(0)
		killed := time.Now()
		t.Logf("%v: %d runs; primary SIGKILLed", since(), p.runs.n.Load())
		for {
			if a, err := ha.Primary(ctx); err == nil && a == ha.ServerAddr(1) && store.Ping(ctx) == nil {
				break
			}
			if time.Since(killed) > time.Minute {
				t.Errorf("no failover to the replica within a minute")
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		failover = time.Since(killed)
		p.runs.mu.Lock()
		for id, c := range p.runs.by {
			ranBefore[id] = c
		}
		p.runs.mu.Unlock()
		ids := p.acceptedSoFar()
		recs, err := store.GetJobs(ctx, ids)
		if err != nil {
			t.Errorf("read the records after the failover: %v", err)
			return
		}
		for i, r := range recs {
			if r == nil {
				vanished[ids[i]] = true
			}
		}
		t.Logf("%v: of %d jobs accepted so far, %d have no record on the new primary", since(), len(ids), len(vanished))
		t.Logf("%v: %d runs; the Sentinels promoted the replica %v after the kill; Kiln writes to it", since(), p.runs.n.Load(), failover.Round(time.Millisecond))
	}()
	subs := p.submitAll(t, n, 40)
	t.Logf("%v: %d jobs accepted", since(), n)
	<-chaos
	open := p.settle(t, subs, time.Minute)
	t.Logf("%v: settled", since())

	restored, lostAfterRun, twice, notSucceeded, retried := 0, 0, 0, 0, 0
	for _, s := range subs {
		retried += min(s.retries, 1)
		if s.id == "" {
			continue
		}
		if c := p.runs.of(s.id); c > 1 {
			twice++
		}
		rec, err := store.GetJob(ctx, s.id)
		switch {
		case err != nil && vanished[s.id] && p.runs.of(s.id) > 0:
			lostAfterRun++ // ran and was acked in the window; its result went with the old primary
		case err == nil && rec.Status.Terminal() && vanished[s.id]:
			restored++
		}
		if err == nil && rec.Status.Terminal() && rec.Status != job.StatusSucceeded {
			notSucceeded++
			t.Logf("job %s ended %s: %+v", s.id, rec.Status, rec.Result.Error)
		}
	}
	reverted := 0
	for _, id := range open {
		rec, err := store.GetJob(ctx, id)
		switch {
		case err != nil && vanished[id] && p.runs.of(id) > 0:
			continue // counted in lostAfterRun
		case err == nil && ranBefore[id] > 0 && p.runs.of(id) == ranBefore[id]:
			// It ran, was recorded and acked on the old primary only: the
			// new primary holds an older state and no message is left to
			// redeliver. The known gap (README, "Redis with Sentinel").
			reverted++
			t.Logf("job %s reverted to %q by the failover after it ran and was acked", id, rec.Status)
			continue
		}
		t.Errorf("job %s left non-terminal: status %q, err %v, runs %d, vanished %v", id, rec.Status, err, p.runs.of(id), vanished[id])
	}
	t.Logf("%d jobs, failover %v: %d submissions retried (503 during failover), %d records vanished with the old primary: %d restored from their queue message and ended, %d had run and been acked in the window (result lost with the old primary); %d reverted to queued/running after running and being acked in the window; %d ran twice, %d ended other than succeeded; %d runs",
		n, failover.Round(time.Millisecond), retried, len(vanished), restored, lostAfterRun, reverted, twice, notSucceeded, p.runs.n.Load())
	if failover == 0 {
		t.Error("no failover happened")
	}
	if restored == 0 {
		t.Error("no record vanished and was restored: the reconciliation path was not exercised")
	}
}
