package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Acceptance 8: Kiln on Redis behind three Sentinels, with workers that ack
// a job only once a replica holds its result (MinReplicas 1). Under a load
// of 500 jobs the replica is cut off (a replica lagging behind), so for a
// second the primary acknowledges writes that reach no replica; then the
// primary is SIGKILLed and the Sentinels promote the replica, which lacks
// that second's writes. The old primary is then restarted, empty, as an
// operator would, and the Sentinels make it the new primary's replica.
//
// Jobs whose record vanished while their message was queued are restored
// from the message and run; jobs that ran in the window kept their message
// until a replica held their result, writing it again on the new primary,
// so none is lost. The test reports the figures and fails on any job left
// non-terminal or run twice, and when either path was not exercised.
func TestRedisSentinelFailover(t *testing.T) {
	n := loadJobs(t)
	ha := testenv.StartRedisHA(t)
	ctx := context.Background()
	store, err := cache.New(ctx, cache.Config{SentinelAddrs: ha.SentinelAddrs(), SentinelMaster: testenv.SentinelMaster,
		MinReplicas: 1, ReplicaWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ns := testenv.StartNATS(t)
	q := queue.Config{AckWait: 2 * time.Second, MaxDeliver: 5}
	// 20 jobs a second run while 40 are submitted: a backlog builds, so jobs
	// submitted in the replication window are still queued at the failover.
	// Ten run at once, so several results are in the window.
	ws := &waitCounter{Store: store, jobs: map[string]bool{}}
	p := startPipelineWith(t, ns.URL(), store, ws, q, 2, 5, 500*time.Millisecond)

	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }
	var failover, resync time.Duration
	vanished := map[string]bool{}  // accepted jobs the new primary had no record of then
	rewritten := map[string]bool{} // jobs holding their message for a replica whose result the new primary lacked then
	chaos := make(chan struct{})
	go func() {
		defer close(chaos)
		testkit.Poll(2*time.Minute, func() bool { return p.runs.n.Load() >= int64(n/5) })
		if err := ha.CutReplica(ctx); err != nil {
			t.Errorf("cut the replica off: %v", err)
			return
		}
		t.Logf("%v: %d runs; replica cut off, the primary's writes reach no replica", since(), p.runs.n.Load())
		// The window is exercised: results fall short of the replica (their
		// jobs keep their messages) and submissions are accepted whose
		// records no replica holds.
		cutAccepted := len(p.acceptedSoFar())
		if !testkit.Poll(time.Minute, func() bool {
			waited, _ := ws.figures()
			return waited >= 3 && len(p.acceptedSoFar()) >= cutAccepted+10
		}) {
			waited, _ := ws.figures()
			t.Errorf("within a minute of the replica being cut off: %d results short of it, %d submissions accepted", waited, len(p.acceptedSoFar())-cutAccepted)
			return
		}
		ha.KillServer(0)
		killed := time.Now()
		t.Logf("%v: %d runs; primary SIGKILLed", since(), p.runs.n.Load())
		if !testkit.Poll(time.Minute, func() bool {
			a, err := ha.Primary(ctx)
			return err == nil && a == ha.ServerAddr(1) && store.Ping(ctx) == nil
		}) {
			t.Errorf("no failover to the replica within a minute")
			return
		}
		failover = time.Since(killed)
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
			if ws.waited(ids[i]) && (r == nil || !r.Status.Terminal()) {
				rewritten[ids[i]] = true
			}
		}
		t.Logf("%v: %d runs; the Sentinels promoted the replica %v after the kill; of %d jobs accepted so far, %d have no record on the new primary; %d results held unacked lack there",
			since(), p.runs.n.Load(), failover.Round(time.Millisecond), len(ids), len(vanished), len(rewritten))

		// The new primary has no replica: results wait. Bring the old
		// primary back; the Sentinels make it a replica of the new one.
		// The Sentinels see it on their next INFO round (every 10 s) and
		// turn it into a replica, which then syncs in full. A Sentinel
		// whose timer ran late (a loaded host) goes into TILT and acts on
		// nothing for 30 s, so the wait allows for one TILT.
		ha.RestartServer(0)
		restarted := time.Now()
		if !testkit.Poll(2*time.Minute, func() bool { return ha.InSync(ctx, 0) }) {
			t.Errorf("the restarted server did not become an in-sync replica within two minutes")
			return
		}
		resync = time.Since(restarted)
		t.Logf("%v: %d runs; the old primary, restarted, is the new primary's replica (in sync %v after its restart)",
			since(), p.runs.n.Load(), resync.Round(time.Millisecond))
	}()
	subs := p.submitAll(t, n, 40)
	t.Logf("%v: %d jobs accepted", since(), n)
	<-chaos
	open := p.settle(t, subs, time.Minute)
	t.Logf("%v: settled", since())

	restored, twice, notSucceeded, retried := 0, 0, 0, 0
	for _, s := range subs {
		retried += min(s.retries, 1)
		if s.id == "" {
			continue
		}
		if c := p.runs.of(s.id); c > 1 {
			twice++
			t.Errorf("job %s ran %d times", s.id, c)
		}
		rec, err := store.GetJob(ctx, s.id)
		if err == nil && rec.Status.Terminal() && vanished[s.id] {
			restored++
		}
		if err == nil && rec.Status.Terminal() && rec.Status != job.StatusSucceeded {
			notSucceeded++
			t.Logf("job %s ended %s: %+v", s.id, rec.Status, rec.Result.Error)
		}
	}
	for _, id := range open {
		rec, err := store.GetJob(ctx, id)
		t.Errorf("job %s left non-terminal: status %q, err %v, runs %d, vanished %v", id, rec.Status, err, p.runs.of(id), vanished[id])
	}
	waited, longest := ws.figures()
	t.Logf("%d jobs, failover %v, old primary back in sync %v after its restart: %d submissions retried (503 during failover); %d records vanished with the old primary, %d of them restored from their queue message and ended; %d jobs' results waited for a replica before their ack (longest wait %v), %d of them lost by the failover and written again on the new primary; %d left non-terminal, %d ran twice, %d ended other than succeeded; %d runs",
		n, failover.Round(time.Millisecond), resync.Round(time.Millisecond), retried, len(vanished), restored,
		waited, longest.Round(time.Millisecond), len(rewritten), len(open), twice, notSucceeded, p.runs.n.Load())
	if failover == 0 {
		t.Error("no failover happened")
	}
	if restored == 0 {
		t.Error("no record vanished and was restored: the reconciliation path was not exercised")
	}
	if waited == 0 || len(rewritten) == 0 {
		t.Error("no result waited for a replica and was lost by the failover: the replication window was not exercised")
	}
}

// waitCounter is the workers' store, counting the jobs whose terminal write
// or confirmation fell short of the replicas (cache.ErrNotReplicated) and
// how long the longest of them waited until it was confirmed.
type waitCounter struct {
	*cache.Store
	mu      sync.Mutex
	jobs    map[string]bool
	first   map[string]time.Time // first shortfall of a job not confirmed yet
	longest time.Duration
}

func (c *waitCounter) note(id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first == nil {
		c.first = map[string]time.Time{}
	}
	switch {
	case errors.Is(err, cache.ErrNotReplicated):
		c.jobs[id] = true
		if _, ok := c.first[id]; !ok {
			c.first[id] = time.Now()
		}
	case err == nil:
		if at, ok := c.first[id]; ok {
			c.longest = max(c.longest, time.Since(at))
			delete(c.first, id)
		}
	}
}

func (c *waitCounter) waited(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[id]
}

func (c *waitCounter) figures() (jobs int, longest time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs), c.longest
}

func (c *waitCounter) Finish(ctx context.Context, id string, res job.Result) (bool, error) {
	won, err := c.Store.Finish(ctx, id, res)
	c.note(id, err)
	return won, err
}

func (c *waitCounter) Abandon(ctx context.Context, id string, res job.Result) (bool, error) {
	won, err := c.Store.Abandon(ctx, id, res)
	c.note(id, err)
	return won, err
}

func (c *waitCounter) ConfirmTerminal(ctx context.Context, id string) (job.Status, error) {
	st, err := c.Store.ConfirmTerminal(ctx, id)
	c.note(id, err)
	return st, err
}
