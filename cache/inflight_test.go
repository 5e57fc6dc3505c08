package cache

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestInflightOwnership(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{JobTTL: time.Hour})
	ctx := context.Background()
	key := job.CodeSHA256("same job")
	a, b := job.NewID(), job.NewID()

	if leader, claimed, err := s.ClaimInflight(ctx, key, a); err != nil || !claimed || leader != a {
		t.Fatalf("first claim = %q, %v, %v", leader, claimed, err)
	}
	if ttl := s.rdb.PTTL(ctx, s.keys.inflight(key)).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("claim TTL %v, want JobTTL", ttl)
	}
	if leader, claimed, err := s.ClaimInflight(ctx, key, b); err != nil || claimed || leader != a {
		t.Fatalf("second job's claim = %q, %v, %v; want leader %s", leader, claimed, err, a)
	}
	if leader, claimed, _ := s.ClaimInflight(ctx, key, a); !claimed || leader != a {
		t.Fatal("the leader's repeated claim was refused")
	}
	// A follower cannot release the leader's claim.
	if err := s.ReleaseInflight(ctx, key, b); err != nil {
		t.Fatal(err)
	}
	if leader, _, _ := s.ClaimInflight(ctx, key, b); leader != a {
		t.Fatalf("follower released the claim; leader now %q", leader)
	}
	if err := s.ReleaseInflight(ctx, key, a); err != nil {
		t.Fatal(err)
	}
	if leader, claimed, _ := s.ClaimInflight(ctx, key, b); !claimed || leader != b {
		t.Fatalf("after release, claim = %q, %v", leader, claimed)
	}
}

func TestFinishReleasesOnlyItsOwnClaim(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	leader := newMessage(t)
	mustCreate(t, s, leader)
	mustClaim(t, s, leader)
	if _, err := s.Finish(ctx, leader.ID, job.Result{Status: job.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if n := s.rdb.Exists(ctx, s.keys.inflight(leader.Key)).Val(); n != 0 {
		t.Fatal("Finish left the leader's in-flight claim")
	}

	// A job that was not the leader for its key must not release the leader's claim.
	follower := newMessage(t)
	other := job.NewID()
	mustCreate(t, s, follower)
	if _, claimed, _ := s.ClaimInflight(ctx, follower.Key, other); !claimed {
		t.Fatal("claim failed")
	}
	if _, err := s.Finish(ctx, follower.ID, job.Result{Status: job.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if leader, _, _ := s.ClaimInflight(ctx, follower.Key, job.NewID()); leader != other {
		t.Fatalf("Finish released another job's claim; leader now %q", leader)
	}
}
