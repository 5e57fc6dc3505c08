package cache

import (
	"context"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestClaimIdempotency(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{JobTTL: time.Hour})
	ctx := context.Background()
	first, second := job.NewID(), job.NewID()

	id, hash, claimed, err := s.ClaimIdempotency(ctx, "key-1", "order-42", "hash-a", first)
	if err != nil || !claimed || id != first || hash != "hash-a" {
		t.Fatalf("first claim = %q %q %v %v", id, hash, claimed, err)
	}
	if ttl := s.rdb.PTTL(ctx, s.keys.idempotency("key-1", "order-42")).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("claim TTL %v, want JobTTL", ttl)
	}
	// The client retries the same request: it gets the first job.
	id, hash, claimed, err = s.ClaimIdempotency(ctx, "key-1", "order-42", "hash-a", second)
	if err != nil || claimed || id != first || hash != "hash-a" {
		t.Fatalf("retry = %q %q %v %v; want the first job", id, hash, claimed, err)
	}
	// The client reuses the key for a different body: the caller sees the mismatch.
	id, hash, claimed, err = s.ClaimIdempotency(ctx, "key-1", "order-42", "hash-b", second)
	if err != nil || claimed || id != first || hash != "hash-a" {
		t.Fatalf("reuse = %q %q %v %v; want the first claim back", id, hash, claimed, err)
	}
	// Repeating the winning call reports the claim as ours.
	if _, _, claimed, _ := s.ClaimIdempotency(ctx, "key-1", "order-42", "hash-a", first); !claimed {
		t.Fatal("repeated winning claim refused")
	}
	// Scopes are independent, including ones that look like a prefix of another.
	for _, scope := range []string{"key-2", "key-1:order-42", "key"} {
		if _, _, claimed, err := s.ClaimIdempotency(ctx, scope, "order-42", "hash-b", second); err != nil || !claimed {
			t.Fatalf("scope %q: claimed=%v err=%v", scope, claimed, err)
		}
	}
}
