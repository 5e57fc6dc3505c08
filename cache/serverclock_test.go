package cache

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripts time leases, rate buckets and CPU reservations by the Redis
// server's clock (TIME), which a test cannot move. These helpers move the
// stored instants back instead, which is the same to every script: "d has
// passed since" reads the same whether now grew or the instant shrank.

// ageField moves the millisecond instant in field of hash key back by d.
func ageField(t *testing.T, s *Store, key, field string, d time.Duration) {
	t.Helper()
	if err := s.rdb.HIncrBy(context.Background(), key, field, -d.Milliseconds()).Err(); err != nil {
		t.Fatalf("age %s %s: %v", key, field, err)
	}
}

// ageLease lets d of job id's lease pass.
func ageLease(t *testing.T, s *Store, id string, d time.Duration) {
	t.Helper()
	ageField(t, s, s.keys.job(id), "lease_until", d)
}

// leaseLeft is how long job id's lease has to run by the server's clock.
func leaseLeft(t *testing.T, s *Store, id string) time.Duration {
	t.Helper()
	ctx := context.Background()
	until, err := s.rdb.HGet(ctx, s.keys.job(id), "lease_until").Int64()
	if err != nil {
		t.Fatalf("read lease_until: %v", err)
	}
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(until-now.UnixMilli()) * time.Millisecond
}

// ageRateBucket lets d pass for tenant's token bucket.
func ageRateBucket(t *testing.T, s *Store, tenant string, d time.Duration) {
	t.Helper()
	ageField(t, s, s.keys.rateBucket(tenant), "ts", d)
}

// ageCPUReservation lets d pass for run id's CPU reservation of tenant.
func ageCPUReservation(t *testing.T, s *Store, tenant, id string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	key := s.keys.cpuReserved(tenant)
	v, err := s.rdb.HGet(ctx, key, id).Result()
	if err != nil {
		t.Fatalf("read reservation %s: %v", id, err)
	}
	ms, exp, ok := strings.Cut(v, ":")
	until, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil {
		t.Fatalf("reservation %s: %q", id, v)
	}
	if err := s.rdb.HSet(ctx, key, id, fmt.Sprintf("%s:%d", ms, until-d.Milliseconds())).Err(); err != nil {
		t.Fatal(err)
	}
}
