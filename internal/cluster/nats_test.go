package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Acceptance 7: Kiln on a three-node JetStream cluster with KILN_JOBS at R3.
// Under a load of short jobs, the stream leader is SIGKILLed (and comes
// back), then every node is restarted in turn: no job lost, none run twice,
// none stranded in the stream.
func TestNATSClusterLeaderKillAndRollingRestart(t *testing.T) {
	n := loadJobs(t)
	cl := testenv.StartNATSCluster(t, 3)
	r := testenv.StartRedis(t)
	store, err := cache.New(context.Background(), cache.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	q := queue.Config{Replicas: 3, AckWait: 5 * time.Second, MaxDeliver: 5}
	p := startPipeline(t, cl.URLs(), store, q, 2, 2, 200*time.Millisecond)

	js, err := jetstream.New(connect(t, cl.URLs(), "test-observer"))
	if err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.StreamInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, job.StreamName)
		if err != nil {
			return nil
		}
		si, err := s.Info(ctx)
		if err != nil {
			return nil
		}
		return si
	}
	if si := info(); si == nil || si.Config.Replicas != 3 || si.Cluster == nil || len(si.Cluster.Replicas) != 2 {
		t.Fatalf("stream %s is not at R3 on the cluster: %+v", job.StreamName, si)
	}
	// waitCurrent waits until the stream has a leader and both followers are current.
	waitCurrent := func(within time.Duration) string {
		var si *jetstream.StreamInfo
		if !testkit.Poll(within, func() bool {
			si = info()
			return si != nil && si.Cluster != nil && si.Cluster.Leader != "" && len(si.Cluster.Replicas) == 2 &&
				si.Cluster.Replicas[0].Current && si.Cluster.Replicas[1].Current
		}) {
			t.Fatalf("stream not back to a leader and two current replicas within %v: %+v", within, si)
		}
		return si.Cluster.Leader
	}
	// waitDown waits until the stream sees node name gone: not its leader,
	// and not a current replica.
	waitDown := func(name string, within time.Duration) {
		if !testkit.Poll(within, func() bool {
			si := info()
			if si == nil || si.Cluster == nil || si.Cluster.Leader == "" || si.Cluster.Leader == name {
				return false
			}
			for _, r := range si.Cluster.Replicas {
				if r.Name == name && r.Current && !r.Offline {
					return false
				}
			}
			return true
		}) {
			t.Errorf("the stream did not see %s go within %v: %+v", name, within, info())
		}
	}

	start := time.Now()
	chaos := make(chan struct{})
	go func() {
		defer close(chaos)
		testkit.Poll(3*time.Minute, func() bool { return p.runs.n.Load() >= int64(n/10) })
		leader := waitCurrent(30 * time.Second)
		i := cl.Index(leader)
		t.Logf("%v: %d runs; SIGKILL stream leader %s", time.Since(start).Round(time.Millisecond), p.runs.n.Load(), leader)
		cl.Kill(i)
		waitDown(leader, 30*time.Second) // a new leader is elected
		if si := info(); si != nil && si.Cluster != nil {
			t.Logf("%v: new leader %s", time.Since(start).Round(time.Millisecond), si.Cluster.Leader)
		}
		cl.Start(i)
		waitCurrent(60 * time.Second)
		for k := range 3 {
			t.Logf("%v: %d runs; rolling restart of %s", time.Since(start).Round(time.Millisecond), p.runs.n.Load(), cl.Name(k))
			cl.Stop(k)
			waitDown(cl.Name(k), 30*time.Second)
			cl.Start(k)
			waitCurrent(60 * time.Second)
		}
		done := p.runs.n.Load()
		t.Logf("%v: %d runs; rolling restart done", time.Since(start).Round(time.Millisecond), done)
		if done >= int64(n) {
			t.Errorf("the load (%d jobs) drained before the rolling restart ended: the faults were not under load", n)
		}
	}()

	subs := p.submitAll(t, n, 30)
	t.Logf("%v: %d jobs accepted", time.Since(start).Round(time.Millisecond), n)
	<-chaos
	open := p.settle(t, subs, 3*time.Minute)
	t.Logf("%v: settled", time.Since(start).Round(time.Millisecond))

	retried, twice, notSucceeded, forked := 0, 0, 0, 0
	for i, s := range subs {
		retried += min(s.retries, 1)
		if len(s.ids) > 1 {
			forked++
			t.Errorf("job %d: one Idempotency-Key got ids %v", i, s.ids)
		}
		if s.id == "" {
			continue
		}
		if c := p.runs.of(s.id); c > 1 {
			twice++
			t.Errorf("job %d (%s) ran %d times", i, s.id, c)
		}
		rec, err := store.GetJob(context.Background(), s.id)
		if err == nil && rec.Status.Terminal() && rec.Status != job.StatusSucceeded {
			notSucceeded++
			t.Errorf("job %d (%s) ended %s: %+v", i, s.id, rec.Status, rec.Result.Error)
		}
	}
	for _, id := range open {
		rec, err := store.GetJob(context.Background(), id)
		t.Errorf("job %s stranded: status %q, err %v, runs %d", id, rec.Status, err, p.runs.of(id))
	}
	// Nothing stranded in the stream either: it drains once every job is done.
	var si *jetstream.StreamInfo
	if !testkit.Poll(30*time.Second, func() bool {
		si = info()
		return si != nil && si.State.Msgs == 0
	}) {
		t.Errorf("stream still holds messages after every job ended: %+v", si)
	}
	t.Logf("%d jobs: %d lost (accepted, never terminal), %d run twice, %d not succeeded, %d submissions retried (503/timeouts during failover), %d keys with two ids; %d sandbox runs",
		n, len(open), twice, notSucceeded, retried, forked, p.runs.n.Load())
}
