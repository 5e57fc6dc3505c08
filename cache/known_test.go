package cache

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A hit of a known entry is recorded, by the script (any id) or by the
// transaction (an id no one else knows), only while the entry in Redis is
// the one remembered; the record reads back as the answer given.
func TestKnownResultAliasChecksTheEntry(t *testing.T) {
	t.Parallel()
	for name, create := range map[string]func(*Store) func(context.Context, *KnownResult, job.Message) (bool, error){
		"script": func(s *Store) func(context.Context, *KnownResult, job.Message) (bool, error) {
			return s.CreateAliasOfKnown
		},
		"transaction": func(s *Store) func(context.Context, *KnownResult, job.Message) (bool, error) {
			return s.CreateHitOfKnown
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testKnownHitChecksTheEntry(t, create)
		})
	}
}

func testKnownHitChecksTheEntry(t *testing.T, create func(*Store) func(context.Context, *KnownResult, job.Message) (bool, error)) {
	s, _ := setup(t, Config{})
	ctx := context.Background()
	key := job.CodeSHA256("known")
	if _, ok := s.KnownResult(key); ok {
		t.Fatal("an entry is known before any lookup")
	}
	res := sampleResult(job.StatusSucceeded, nil)
	if err := s.StoreResult(ctx, key, res); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.KnownResult(key); ok {
		t.Fatal("StoreResult made the entry known; only a lookup does")
	}
	if _, ok, err := s.LookupResult(ctx, key); !ok || err != nil {
		t.Fatalf("LookupResult = %v, %v", ok, err)
	}
	known, ok := s.KnownResult(key)
	if !ok || known.Result.Stdout != res.Stdout || known.Key != key {
		t.Fatalf("KnownResult after a lookup = %+v, %v", known, ok)
	}

	alias := func(known *KnownResult) (job.Message, bool) {
		t.Helper()
		msg := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python", Code: "secret"}, Key: key,
			CreatedAt: time.Now().UTC().Truncate(time.Millisecond), TraceID: "trace", Tenant: "t1", CacheScope: "tenant:t1"}
		ok, err := create(s)(ctx, known, msg)
		if err != nil {
			t.Fatalf("record the hit: %v", err)
		}
		return msg, ok
	}
	// The entry is unchanged: the hit is recorded as CreateAlias records it.
	msg, ok := alias(known)
	if !ok {
		t.Fatal("a hit of the entry in Redis was not recorded")
	}
	rec, err := s.GetJob(ctx, msg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != job.StatusSucceeded || !rec.CacheHit || rec.Message.Tenant != "t1" || rec.Message.Spec.Code != "" ||
		rec.FinishedAt == nil || !rec.FinishedAt.Equal(msg.CreatedAt) {
		t.Fatalf("cache-hit record: %+v", rec)
	}
	// It reads back as the answer the API gave, and as CreateAlias's record of it would.
	want := HitOf(known.Result, msg.ID, msg.TraceID, msg.CreatedAt)
	if !reflect.DeepEqual(*rec.Result, want) {
		t.Fatalf("cache-hit record's result\n got %+v\nwant %+v", *rec.Result, want)
	}
	viaAlias := msg
	viaAlias.ID = job.NewID()
	if err := s.CreateAlias(ctx, viaAlias, HitOf(known.Result, viaAlias.ID, msg.TraceID, msg.CreatedAt)); err != nil {
		t.Fatal(err)
	}
	other, err := s.GetJob(ctx, viaAlias.ID)
	if err != nil {
		t.Fatal(err)
	}
	other.Result.ID, other.Message.ID = msg.ID, msg.ID
	if !reflect.DeepEqual(other, rec) {
		t.Fatalf("CreateAlias's record and CreateAliasOfKnown's differ:\n%+v\n%+v", other, rec)
	}
	if ttl := s.rdb.PTTL(ctx, s.keys.job(msg.ID)).Val(); ttl <= 0 || ttl > JobTTLDefault {
		t.Fatalf("cache-hit record TTL %v", ttl)
	}

	// Replaced in Redis (a newer run of the same key): nothing is recorded,
	// the entry is forgotten, and the next lookup knows the new one.
	newer := sampleResult(job.StatusSucceeded, nil)
	newer.Stdout = "newer"
	if err := s.StoreResult(ctx, key, newer); err != nil {
		t.Fatal(err)
	}
	msg, ok = alias(known)
	if ok {
		t.Fatal("a hit of a replaced entry was recorded")
	}
	if _, err := s.GetJob(ctx, msg.ID); err == nil {
		t.Fatal("a record was made for a replaced entry")
	}
	if _, ok := s.KnownResult(key); ok {
		t.Fatal("a replaced entry is still known")
	}
	if got, _, _ := s.LookupResult(ctx, key); got.Stdout != "newer" {
		t.Fatalf("lookup after replacement: %q", got.Stdout)
	}
	known, ok = s.KnownResult(key)
	if !ok || known.Result.Stdout != "newer" {
		t.Fatalf("KnownResult after the new lookup = %+v, %v", known, ok)
	}

	// Gone from Redis (expired): nothing is recorded.
	s.rdb.Del(ctx, s.keys.result(key))
	if _, ok := alias(known); ok {
		t.Fatal("a hit of an expired entry was recorded")
	}
	if _, ok, _ := s.LookupResult(ctx, key); ok {
		t.Fatal("lookup of an expired entry hit")
	}
}

func TestKnownResultBounds(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()

	// Entries larger than the check sends with each hit are not kept.
	big := sampleResult(job.StatusSucceeded, nil)
	big.SetOutput([]byte(strings.Repeat("x", knownMaxValueBytes)), nil)
	key := job.CodeSHA256("big")
	if err := s.StoreResult(ctx, key, big); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.LookupResult(ctx, key); !ok || err != nil {
		t.Fatalf("LookupResult = %v, %v", ok, err)
	}
	if _, ok := s.KnownResult(key); ok {
		t.Fatal("an entry over knownMaxValueBytes is known")
	}

	// The memory holds at most knownMaxEntries.
	res := sampleResult(job.StatusSucceeded, nil)
	raw, err := encodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for i := range knownMaxEntries + 10 {
		s.known.note(job.CodeSHA256(strings.Repeat("k", i+1)), raw)
	}
	if n := len(s.known.m); n != knownMaxEntries {
		t.Fatalf("%d entries known, want the bound %d", n, knownMaxEntries)
	}
}

// A record already holding the id (a retried submission) is left alone,
// and the hit stands.
func TestKnownResultAliasLeavesARecord(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	key := job.CodeSHA256("retried")
	if err := s.StoreResult(ctx, key, sampleResult(job.StatusSucceeded, nil)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LookupResult(ctx, key); err != nil {
		t.Fatal(err)
	}
	known, _ := s.KnownResult(key)
	msg := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python"}, Key: key, CreatedAt: time.Now().UTC()}
	first := HitOf(known.Result, msg.ID, msg.TraceID, msg.CreatedAt)
	first.Stdout = "first answer"
	if err := s.CreateAlias(ctx, msg, first); err != nil {
		t.Fatal(err)
	}
	ok, err := s.CreateAliasOfKnown(ctx, known, msg)
	if err != nil || !ok {
		t.Fatalf("CreateAliasOfKnown over an existing record = %v, %v; want true, nil", ok, err)
	}
	if rec, err := s.GetJob(ctx, msg.ID); err != nil || rec.Result.Stdout != "first answer" {
		t.Fatalf("existing record changed: %+v, %v", rec.Result, err)
	}
}
