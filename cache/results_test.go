package cache

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestResultCache(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, Config{ResultTTL: 2 * time.Hour})
	ctx := context.Background()

	if _, ok, err := s.LookupResult(ctx, "nothing-here"); ok || err != nil {
		t.Fatalf("LookupResult(miss) = %v, %v", ok, err)
	}

	cacheable := map[string]job.Result{
		"succeeded":     sampleResult(job.StatusSucceeded, nil),
		"syntax error":  sampleResult(job.StatusFailed, job.NewFailure(job.CategorySyntaxError, "invalid syntax")),
		"runtime error": sampleResult(job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, "ZeroDivisionError")),
	}
	for name, res := range cacheable {
		key := job.CodeSHA256(name)
		if err := s.StoreResult(ctx, key, res); err != nil {
			t.Fatalf("%s: StoreResult: %v", name, err)
		}
		got, ok, err := s.LookupResult(ctx, key)
		if err != nil || !ok {
			t.Fatalf("%s: LookupResult = %v, %v", name, ok, err)
		}
		if !reflect.DeepEqual(got, res) {
			t.Fatalf("%s: round trip\n got %+v\nwant %+v", name, got, res)
		}
		if ttl := s.rdb.PTTL(ctx, s.keys.result(key)).Val(); ttl <= time.Hour || ttl > 2*time.Hour {
			t.Fatalf("%s: TTL %v, want about 2h", name, ttl)
		}
	}

	notCacheable := map[string]job.Result{
		"timeout":        sampleResult(job.StatusTimedOut, job.NewFailure(job.CategoryTimeout, "10s")),
		"oom":            sampleResult(job.StatusOOMKilled, job.NewFailure(job.CategoryMemoryLimit, "256MB")),
		"internal":       sampleResult(job.StatusInternalError, job.NewFailure(job.CategoryInternal, "containerd")),
		"canceled":       sampleResult(job.StatusCanceled, job.NewFailure(job.CategoryCanceled, "by client")),
		"output limit":   sampleResult(job.StatusFailed, job.NewFailure(job.CategoryOutputLimit, "too much")),
		"failed, no why": sampleResult(job.StatusFailed, nil),
	}
	for name, res := range notCacheable {
		key := job.CodeSHA256(name)
		if err := s.StoreResult(ctx, key, res); err != nil {
			t.Fatalf("%s: StoreResult = %v, want a silent refusal", name, err)
		}
		if _, ok, err := s.LookupResult(ctx, key); ok || err != nil {
			t.Fatalf("%s: non-cacheable result was stored (ok=%v err=%v)", name, ok, err)
		}
	}

	// A later cacheable result replaces the entry; a corrupt entry reads as a miss.
	key := job.CodeSHA256("succeeded")
	newer := sampleResult(job.StatusSucceeded, nil)
	newer.Stdout = "newer"
	if err := s.StoreResult(ctx, key, newer); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.LookupResult(ctx, key); got.Stdout != "newer" {
		t.Fatalf("entry not replaced: %q", got.Stdout)
	}
	s.rdb.Set(ctx, s.keys.result(key), "{not json", time.Minute)
	if _, ok, err := s.LookupResult(ctx, key); ok || err != nil {
		t.Fatalf("corrupt entry: ok=%v err=%v, want a miss", ok, err)
	}
}

// sampleResult is a result as a worker would store it.
func sampleResult(st job.Status, f *job.Failure) job.Result {
	start := time.Date(2026, 11, 21, 12, 0, 0, 123456789, time.UTC)
	end := start.Add(42 * time.Millisecond)
	exit := 0
	if st != job.StatusSucceeded {
		exit = 1
	}
	r := job.Result{
		ID: job.NewID(), Status: st, ExitCode: &exit, Error: f,
		StdoutBytes: 2048, StderrBytes: 11,
		WallMS: 42, CPUMS: 30, MemoryPeakBytes: 12 << 20,
		Image:  job.Image{Name: "kiln/python:3.13", Digest: "sha256:0123456789abcdef"},
		Limits: &job.DefaultLimits, Attempt: 1, Worker: "worker-1",
		StartedAt: &start, FinishedAt: &end, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
	}
	r.SetOutput([]byte(strings.Repeat("line of output\n", 136)), []byte("warning: x\n"))
	return r
}

// BenchmarkLookupResult measures the API's cache-hit path against a real
// redis-server: one GET of a ~2 KiB result and its JSON decode.
//
//   - sequential: one caller; ns/op is the latency of one hit.
//   - concurrent: 4 callers per GOMAXPROCS, as under an API serving many
//     requests; 1e9/(ns/op) is hits per second.
//
// Both report the median and 99th percentile latency of single lookups.
func BenchmarkLookupResult(b *testing.B) {
	s, _ := setup(b, Config{})
	ctx := context.Background()
	res := sampleResult(job.StatusSucceeded, nil)
	key := job.CodeSHA256("bench")
	if err := s.StoreResult(ctx, key, res); err != nil {
		b.Fatal(err)
	}
	lookup := func(b *testing.B) time.Duration {
		t0 := time.Now()
		if _, ok, err := s.LookupResult(ctx, key); !ok || err != nil {
			b.Fatalf("LookupResult = %v, %v", ok, err)
		}
		return time.Since(t0)
	}
	b.Run("sequential", func(b *testing.B) {
		b.ReportAllocs()
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			lat = append(lat, lookup(b))
		}
		reportLatency(b, lat)
	})
	b.Run("concurrent", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(4)
		var (
			mu  sync.Mutex
			all []time.Duration
		)
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				mine = append(mine, lookup(b))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
		reportLatency(b, all)
	})
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_µs")
}
