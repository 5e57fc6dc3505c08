package cache

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// pipelineGets notes, for every pipeline holding a transaction, how many
// GETs and HSETs it held.
type pipelineGets struct {
	mu   sync.Mutex
	seen [][2]int
}

func (h *pipelineGets) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var gets, hsets int
		for _, c := range cmds {
			switch c.Name() {
			case "get":
				gets++
			case "hset":
				hsets++
			}
		}
		if hsets > 0 {
			h.mu.Lock()
			h.seen = append(h.seen, [2]int{gets, hsets})
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// Hits of concurrent submissions share transactions, each reading an entry
// once however many of its hits it holds, and every hit is recorded as if
// alone: a hit that stood reads back as the answer it gave, one of a
// replaced entry left no record.
func TestCreateHitOfKnownConcurrentHits(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	hook := &pipelineGets{}
	s.rdb.AddHook(hook)
	ctx := context.Background()
	keys := []string{job.CodeSHA256("stays"), job.CodeSHA256("replaced")}
	for i, key := range keys {
		res := sampleResult(job.StatusSucceeded, nil)
		res.Stdout = fmt.Sprint("entry ", i)
		if err := s.StoreResult(ctx, key, res); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.LookupResult(ctx, key); !ok || err != nil {
			t.Fatalf("LookupResult = %v, %v", ok, err)
		}
	}
	known := make([]*KnownResult, len(keys))
	for i, key := range keys {
		known[i], _ = s.KnownResult(key)
	}

	type hit struct {
		msg job.Message
		k   *KnownResult
		ok  bool
	}
	var mu sync.Mutex
	var hits []hit
	var replaced atomic.Bool
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				k := known[(g+i)%2]
				msg := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python"}, Key: k.Key,
					CreatedAt: time.Now().UTC(), TraceID: "t", Tenant: "t1", CacheScope: "tenant:t1"}
				ok, err := s.CreateHitOfKnown(ctx, k, msg)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				hits = append(hits, hit{msg, k, ok})
				mu.Unlock()
				if g == 0 && i == 20 && replaced.CompareAndSwap(false, true) {
					newer := sampleResult(job.StatusSucceeded, nil)
					newer.Stdout = "newer"
					if err := s.StoreResult(ctx, keys[1], newer); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()

	var stood, refused int
	for _, h := range hits {
		rec, err := s.GetJob(ctx, h.msg.ID)
		if !h.ok {
			refused++
			if h.k != known[1] || err == nil {
				t.Fatalf("a refused hit of entry %q left a record (%v) or its entry was not replaced", h.k.Result.Stdout, err)
			}
			continue
		}
		stood++
		if err != nil {
			t.Fatalf("a recorded hit has no record: %v", err)
		}
		if want := HitOf(h.k.Result, h.msg.ID, h.msg.TraceID, h.msg.CreatedAt); !reflect.DeepEqual(*rec.Result, want) {
			t.Fatalf("hit record reads back\n%+v\nwant %+v", *rec.Result, want)
		}
		if ttl := s.rdb.PTTL(ctx, s.keys.job(h.msg.ID)).Val(); ttl <= 0 {
			t.Fatalf("hit record TTL %v", ttl)
		}
	}
	if stood == 0 || refused == 0 {
		t.Fatalf("%d hits stood, %d refused; want both", stood, refused)
	}

	hook.mu.Lock()
	defer hook.mu.Unlock()
	shared := false
	for _, p := range hook.seen {
		if p[0] > 2 || p[0] > p[1] {
			t.Fatalf("a transaction read %d entries for %d hits of 2 entries", p[0], p[1])
		}
		shared = shared || p[1] > 1
	}
	if !shared {
		t.Fatalf("no transaction held more than one hit: %v", hook.seen)
	}
}

// A hit's record names the entry's hit-result copy rather than holding
// the entry: the copy outlives the record, a replaced entry's earlier hits
// keep reading what they answered, GetJobs reads them as GetJob does, and
// a record whose copy is gone is an error, not a result-less job.
func TestCreateHitOfKnownRecordsNameACopy(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	key := job.CodeSHA256("copied")
	res := sampleResult(job.StatusSucceeded, nil)
	if err := s.StoreResult(ctx, key, res); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LookupResult(ctx, key); err != nil {
		t.Fatal(err)
	}
	known, _ := s.KnownResult(key)
	hit := func(k *KnownResult) job.Message {
		t.Helper()
		msg := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python"}, Key: key, CreatedAt: time.Now().UTC()}
		if ok, err := s.CreateHitOfKnown(ctx, k, msg); !ok || err != nil {
			t.Fatalf("CreateHitOfKnown = %v, %v", ok, err)
		}
		return msg
	}
	first := hit(known)
	raw := s.rdb.HGetAll(ctx, s.keys.job(first.ID)).Val()
	if _, ok := raw[fieldResult]; ok || raw[fieldResultCopy] != known.copyID {
		t.Fatalf("hit record fields %v; want the copy named, no result held", raw)
	}
	copyKey := s.keys.hitResult(known.copyID)
	if v := s.rdb.Get(ctx, copyKey).Val(); v != known.raw {
		t.Fatalf("copy holds %d bytes, want the entry's %d", len(v), len(known.raw))
	}
	if c, r := s.rdb.PTTL(ctx, copyKey).Val(), s.rdb.PTTL(ctx, s.keys.job(first.ID)).Val(); c < r+copySlack-time.Minute {
		t.Fatalf("copy TTL %v, record TTL %v; want the copy to outlive the record by about %v", c, r, copySlack)
	}

	// The entry is replaced: the earlier hit still reads what it answered.
	newer := sampleResult(job.StatusSucceeded, nil)
	newer.Stdout = "newer"
	if err := s.StoreResult(ctx, key, newer); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LookupResult(ctx, key); err != nil {
		t.Fatal(err)
	}
	second := hit(mustKnow(t, s, key))
	recs, err := s.GetJobs(ctx, []string{first.ID, job.NewID(), second.ID})
	if err != nil {
		t.Fatal(err)
	}
	if recs[1] != nil || recs[0].Result.Stdout != res.Stdout || recs[2].Result.Stdout != "newer" ||
		recs[0].Result.ID != first.ID || !recs[2].Result.CacheHit {
		t.Fatalf("GetJobs of two hits of an entry replaced between them: %+v", recs)
	}

	// Only data lost from Redis takes a copy from its records.
	s.rdb.Del(ctx, copyKey)
	if _, err := s.GetJob(ctx, first.ID); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("GetJob of a hit whose copy is gone = %v; want an error", err)
	}
}

func mustKnow(t *testing.T, s *Store, key string) *KnownResult {
	t.Helper()
	k, ok := s.KnownResult(key)
	if !ok {
		t.Fatalf("entry %s is not known", key)
	}
	return k
}

// A transaction sets a copy's TTL again only when this process last set it
// over copyRefresh ago, and brings back a copy that went missing.
func TestCreateHitOfKnownRefreshesTheCopy(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{})
	ctx := context.Background()
	key := job.CodeSHA256("refreshed")
	if err := s.StoreResult(ctx, key, sampleResult(job.StatusSucceeded, nil)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LookupResult(ctx, key); err != nil {
		t.Fatal(err)
	}
	known := mustKnow(t, s, key)
	hit := func() {
		t.Helper()
		msg := job.Message{ID: job.NewID(), Spec: job.Spec{Runtime: "python"}, Key: key, CreatedAt: time.Now().UTC()}
		if ok, err := s.CreateHitOfKnown(ctx, known, msg); !ok || err != nil {
			t.Fatalf("CreateHitOfKnown = %v, %v", ok, err)
		}
	}
	copyKey := s.keys.hitResult(known.copyID)
	full := time.Duration(s.jobTTL)*time.Millisecond + copySlack
	hit()
	if ttl := s.rdb.PTTL(ctx, copyKey).Val(); ttl < full-time.Minute {
		t.Fatalf("copy TTL after the first hit %v, want about %v", ttl, full)
	}

	// Set lately: the next hit leaves the TTL alone.
	s.rdb.PExpire(ctx, copyKey, time.Hour)
	hit()
	if ttl := s.rdb.PTTL(ctx, copyKey).Val(); ttl > time.Hour {
		t.Fatalf("copy TTL %v after a hit within copyRefresh; want it left at 1h", ttl)
	}
	// Set over copyRefresh ago: the next hit sets it again.
	known.copyAt.Store(s.since() - int64(copyRefresh) - 1)
	hit()
	if ttl := s.rdb.PTTL(ctx, copyKey).Val(); ttl < full-time.Minute {
		t.Fatalf("copy TTL %v after a hit past copyRefresh; want about %v", ttl, full)
	}
	// Gone: the next hit makes it again.
	s.rdb.Del(ctx, copyKey)
	hit()
	if v, ttl := s.rdb.Get(ctx, copyKey).Val(), s.rdb.PTTL(ctx, copyKey).Val(); v != known.raw || ttl < full-time.Minute {
		t.Fatalf("copy after a hit found it gone: %d bytes, TTL %v", len(v), ttl)
	}
}
