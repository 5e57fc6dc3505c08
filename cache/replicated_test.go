package cache

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// setupPair starts a primary and its replica and returns a Store on the
// primary asking for one replica (each WAIT bounded by wait), and a Store
// reading the replica.
func setupPair(t *testing.T, wait time.Duration) (primary, replica *Store, ha *testenv.RedisHA) {
	t.Helper()
	ha = testenv.StartRedisPair(t)
	ctx := context.Background()
	primary, err := New(ctx, Config{URL: "redis://" + ha.ServerAddr(0) + "/0", MinReplicas: 1, ReplicaWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	replica, err = New(ctx, Config{URL: "redis://" + ha.ServerAddr(1) + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Close() })
	return primary, replica, ha
}

func createJob(t *testing.T, s *Store) job.Message {
	t.Helper()
	msg := newMessage(t)
	if err := s.CreateJob(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	return msg
}

func succeeded(worker string) job.Result {
	at := time.Now().UTC()
	return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "1\n", Worker: worker, FinishedAt: &at}
}

func TestFinishReturnsOnceAReplicaHoldsTheResult(t *testing.T) {
	t.Parallel()
	// A replica answers WAIT within milliseconds; a loaded host once made
	// it miss 200 ms.
	primary, replica, _ := setupPair(t, 5*time.Second)
	ctx := context.Background()
	msg := createJob(t, primary)
	won, err := primary.Finish(ctx, msg.ID, succeeded("w1"))
	if err != nil || !won {
		t.Fatalf("Finish with the replica attached = %v, %v; want won, nil", won, err)
	}
	// WAIT returned: the replica has the terminal record now, not eventually.
	rec, err := replica.GetJob(ctx, msg.ID)
	if err != nil || rec.Status != job.StatusSucceeded {
		t.Fatalf("replica's record right after Finish: %+v, %v; want succeeded", rec.Status, err)
	}
	if st, err := primary.ConfirmTerminal(ctx, msg.ID); err != nil || st != job.StatusSucceeded {
		t.Fatalf("ConfirmTerminal = %q, %v; want succeeded, nil", st, err)
	}
}

func TestFinishIsNotConfirmedWhileTheReplicaIsCutOff(t *testing.T) {
	t.Parallel()
	primary, replica, ha := setupPair(t, 200*time.Millisecond)
	ctx := context.Background()
	msg := createJob(t, primary)
	queued := createJob(t, primary)
	// Both records reach the replica before it is cut off.
	testkit.Eventually(t, 10*time.Second, "the replica to get both records", func() bool {
		_, err1 := replica.GetJob(ctx, msg.ID)
		_, err2 := replica.GetJob(ctx, queued.ID)
		return err1 == nil && err2 == nil
	})
	if err := ha.CutReplica(ctx); err != nil {
		t.Fatal(err)
	}
	res := succeeded("w1")
	start := time.Now()
	won, err := primary.Finish(ctx, msg.ID, res)
	if !errors.Is(err, ErrNotReplicated) || !won {
		t.Fatalf("Finish with the replica cut off = %v, %v; want won and ErrNotReplicated", won, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Finish took %v; the WAIT is bounded by ReplicaWait (200ms)", took)
	}
	// The result stands on the primary; the replica never got it.
	if rec, err := primary.GetJob(ctx, msg.ID); err != nil || rec.Status != job.StatusSucceeded {
		t.Fatalf("primary's record: %q, %v; want succeeded", rec.Status, err)
	}
	if rec, err := replica.GetJob(ctx, msg.ID); err != nil || rec.Status != job.StatusQueued {
		t.Fatalf("replica's record: %q, %v; want queued (the cut-off replica lags)", rec.Status, err)
	}
	// Repeating the same result is recognised as the same write.
	if won, err := primary.Finish(ctx, msg.ID, res); !errors.Is(err, ErrNotReplicated) || !won {
		t.Fatalf("repeated Finish = %v, %v; want won and ErrNotReplicated", won, err)
	}
	if _, err := primary.ConfirmTerminal(ctx, msg.ID); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("ConfirmTerminal while cut off = %v; want ErrNotReplicated", err)
	}
	// A job that is not terminal has nothing to confirm: no wait, no error.
	if st, err := primary.ConfirmTerminal(ctx, queued.ID); err != nil || st != job.StatusQueued {
		t.Fatalf("ConfirmTerminal of a queued job = %q, %v; want queued, nil", st, err)
	}
	if _, err := primary.ConfirmTerminal(ctx, job.NewID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ConfirmTerminal of no record = %v; want ErrNotFound", err)
	}

	// The replica comes back: the same call now succeeds, and a rival's
	// later result loses but is confirmed too (the recorded one is durable).
	if err := ha.ReconnectReplica(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the replica to be back in sync", func() bool { return ha.InSync(ctx, 1) })
	if won, err := primary.Finish(ctx, msg.ID, res); err != nil || !won {
		t.Fatalf("Finish after the replica came back = %v, %v; want won, nil", won, err)
	}
	if won, err := primary.Finish(ctx, msg.ID, succeeded("w2")); err != nil || won {
		t.Fatalf("a rival's Finish = %v, %v; want lost, nil", won, err)
	}
	if rec, err := replica.GetJob(ctx, msg.ID); err != nil || rec.Status != job.StatusSucceeded || rec.Result.Worker != "w1" {
		t.Fatalf("replica's record after the confirmed Finish: %+v, %v; want w1's succeeded result", rec.Result, err)
	}
	if st, err := primary.ConfirmTerminal(ctx, msg.ID); err != nil || st != job.StatusSucceeded {
		t.Fatalf("ConfirmTerminal = %q, %v; want succeeded, nil", st, err)
	}
}

func TestFinishRepeatedWithTheSameResultWinsAgain(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	msg := createJob(t, s)
	res := succeeded("w1")
	for i := range 2 {
		if won, err := s.Finish(ctx, msg.ID, res); err != nil || !won {
			t.Fatalf("Finish #%d = %v, %v; want won", i+1, won, err)
		}
	}
	if st, err := s.ConfirmTerminal(ctx, msg.ID); err != nil || st != job.StatusSucceeded {
		t.Fatalf("ConfirmTerminal without MinReplicas = %q, %v; want succeeded, nil", st, err)
	}
}

// A store asking for a replica of a server that has none says so at start,
// and a result written there is never confirmed.
func TestMinReplicasOnASingleServer(t *testing.T) {
	t.Parallel()
	var buf testkit.SyncBuffer
	s, _ := setup(t, Config{MinReplicas: 1, ReplicaWait: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if out := buf.String(); !strings.Contains(out, "fewer replicas than MinReplicas") || !strings.Contains(out, "connected_replicas=0") {
		t.Errorf("start-up log %q does not warn of the missing replica", out)
	}
	ctx := context.Background()
	msg := createJob(t, s)
	if won, err := s.Finish(ctx, msg.ID, succeeded("w1")); !won || !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("Finish = %v, %v; want won and ErrNotReplicated", won, err)
	}
}
