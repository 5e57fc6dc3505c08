package cache

import (
	"context"
	"fmt"
	"reflect"
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
