package cache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// setup starts a private redis-server and returns a Store on it.
func setup(t testing.TB, cfg Config) (*Store, *testenv.Redis) {
	t.Helper()
	r := testenv.StartRedis(t)
	cfg.URL = r.URL()
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, r
}

// newMessage returns a realistic message with a fresh id and cache key.
func newMessage(t testing.TB) job.Message {
	t.Helper()
	spec := job.Spec{Runtime: "python", Code: "print(1)", Stdin: "in", Args: []string{"a"},
		Env: map[string]string{"X": "1"}, Files: []job.File{{Name: "f.txt", Content: "c"}}, Limits: job.DefaultLimits}
	id := job.NewID()
	return job.Message{ID: id, Spec: spec, Key: job.Key(spec, "sha256:"+id), CreatedAt: time.Now().UTC(), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "http://example.com"}, "URL"},
		{Config{JobTTL: -time.Second}, "JobTTL"},
		{Config{ResultTTL: time.Microsecond}, "ResultTTL"},
		{Config{MinReplicas: -1}, "MinReplicas"},
		{Config{ReplicaWait: -time.Second}, "ReplicaWait"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error about %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(context.Background(), Config{JobTTL: -1}); err == nil {
		t.Fatal("New accepted an invalid config")
	}
}

func TestNewSaysWhereItTried(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t) // nothing listens there
	start := time.Now()
	_, err := New(context.Background(), Config{URL: fmt.Sprintf("redis://127.0.0.1:%d/3", port)})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New = %v, want ErrUnavailable", err)
	}
	if want := fmt.Sprintf("127.0.0.1:%d (db 3)", port); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("New took %v to fail", d)
	}
}

func TestCloseIsIdempotentAndLaterCallsAreUnavailable(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Ping after Close = %v, want ErrUnavailable", err)
	}
}

// TestOutage stops the server under a live Store: every method must fail
// fast with ErrUnavailable, and the Store must recover once Redis is back.
func TestOutage(t *testing.T) {
	t.Parallel()
	s, r := setup(t, Config{})
	ctx := context.Background()
	msg := newMessage(t)
	if err := s.CreateJob(ctx, msg); err != nil {
		t.Fatal(err)
	}
	r.Stop()

	calls := map[string]func() error{
		"Ping":      func() error { return s.Ping(ctx) },
		"CreateJob": func() error { return s.CreateJob(ctx, newMessage(t)) },
		"GetJob":    func() error { _, err := s.GetJob(ctx, msg.ID); return err },
		"GetJobs":   func() error { _, err := s.GetJobs(ctx, []string{msg.ID}); return err },
		"DeleteJob": func() error { return s.DeleteJob(ctx, msg.ID) },
		"MarkRunning": func() error {
			_, err := s.MarkRunningLeased(ctx, msg.ID, "w", 1, time.Now(), Lease{Token: "w/1"})
			return err
		},
		"Finish": func() error {
			_, err := s.Finish(ctx, msg.ID, job.Result{Status: job.StatusSucceeded})
			return err
		},
		"RenewLease": func() error {
			_, err := s.RenewLease(ctx, msg.ID, Lease{"w/1", time.Second})
			return err
		},
		"Abandon": func() error {
			_, err := s.Abandon(ctx, msg.ID, job.Result{Status: job.StatusInternalError})
			return err
		},
		"Cancel":       func() error { _, err := s.Cancel(ctx, msg.ID); return err },
		"LookupResult": func() error { _, _, err := s.LookupResult(ctx, msg.Key); return err },
		"StoreResult": func() error {
			return s.StoreResult(ctx, msg.Key, job.Result{Status: job.StatusSucceeded})
		},
		"ClaimInflight":   func() error { _, _, err := s.ClaimInflight(ctx, msg.Key, msg.ID); return err },
		"ReleaseInflight": func() error { return s.ReleaseInflight(ctx, msg.Key, msg.ID) },
		"ClaimIdempotency": func() error {
			_, _, _, err := s.ClaimIdempotency(ctx, "k1", "idem", "h", msg.ID)
			return err
		},
		"RegisterRuntime": func() error { return s.RegisterRuntime(ctx, job.RuntimeInfo{Name: "python"}, time.Minute) },
		"Runtimes":        func() error { _, err := s.Runtimes(ctx); return err },
	}
	for name, call := range calls {
		start := time.Now()
		err := call()
		d := time.Since(start)
		t.Logf("%s with redis down: %v after %v", name, err, d)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s with redis down = %v, want ErrUnavailable", name, err)
		}
		if d > 2*time.Second {
			t.Errorf("%s took %v to report the outage", name, d)
		}
	}

	r.Start()
	testkit.Eventually(t, 5*time.Second, "the Store to recover once redis is back", func() bool { return s.Ping(ctx) == nil })
	rec, err := s.GetJob(ctx, msg.ID)
	if err != nil || rec.Status != job.StatusQueued {
		t.Fatalf("after restart GetJob = %+v, %v", rec.Status, err)
	}
}

// Each part of a Store works handed out alone, and what one part writes
// the others read: they share one connection and one key space. Finish
// (Jobs) releases the in-flight claim Claims made, and a result Results
// stored answers through the Store.
func TestPartsWorkAlone(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	jobs, results, claims := s.Jobs, s.Results, s.Claims
	msg := newMessage(t)
	if err := jobs.CreateJob(ctx, msg); err != nil {
		t.Fatalf("Jobs.CreateJob: %v", err)
	}
	if _, claimed, err := claims.ClaimInflight(ctx, msg.Key, msg.ID); err != nil || !claimed {
		t.Fatalf("Claims.ClaimInflight = %v, %v; want the claim", claimed, err)
	}
	if leader, claimed, err := claims.ClaimInflight(ctx, msg.Key, job.NewID()); err != nil || claimed || leader != msg.ID {
		t.Fatalf("a second job's claim = %q, %v, %v; want refused, led by %s", leader, claimed, err, msg.ID)
	}
	res := job.Result{ID: msg.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "42\n"}
	if won, err := jobs.Finish(ctx, msg.ID, res); err != nil || !won {
		t.Fatalf("Jobs.Finish = %v, %v; want won", won, err)
	}
	if err := results.StoreResult(ctx, msg.Key, res); err != nil {
		t.Fatalf("Results.StoreResult: %v", err)
	}
	if _, claimed, err := claims.ClaimInflight(ctx, msg.Key, job.NewID()); err != nil || !claimed {
		t.Fatalf("a claim after Finish = %v, %v; want it (Finish releases the leader's claim)", claimed, err)
	}
	got, ok, err := s.LookupResult(ctx, msg.Key)
	if err != nil || !ok || got.Stdout != res.Stdout {
		t.Fatalf("Store.LookupResult = %+v, %v, %v; want the stored result", got, ok, err)
	}
	rec, err := s.GetJob(ctx, msg.ID)
	if err != nil || rec.Status != job.StatusSucceeded {
		t.Fatalf("Store.GetJob = %+v, %v; want the finished record", rec, err)
	}
}
