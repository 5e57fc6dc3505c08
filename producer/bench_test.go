package producer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
)

func noTracing(c *Config) { c.TracerProvider = noop.NewTracerProvider() }

// BenchmarkCacheHit measures the API handler's cache-hit path against a real
// redis-server: decode, validate, key, one GET, encode.
//
// Spans go to the no-op tracer here, as in a process without a collector; the
// SDK's cost is the exporter's concern, not the handler's.
func BenchmarkCacheHit(b *testing.B) {
	bd := setup(b, noTracing)
	const spec = `{"code":"print('bench')","stdin":"x","limits":{"memory_mb":128}}`
	accepted(b, bd.submit(b, spec))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bd.worker(b, ctx, succeeded("bench\n")); err != nil {
		b.Fatal(err)
	}
	if r := bd.submit(b, spec); r.StatusCode != 200 {
		b.Fatalf("warm-up: %d %s", r.StatusCode, r.body)
	}
	h := bd.srv.Handler()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(spec))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, req)
		lat = append(lat, time.Since(start))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkCacheHitParallel is the same path from many goroutines: its
// ns/op is the inverse of the throughput on GOMAXPROCS cores.
func BenchmarkCacheHitParallel(b *testing.B) {
	bd := setup(b, noTracing)
	const spec = `{"code":"print('bench')","stdin":"x","limits":{"memory_mb":128}}`
	accepted(b, bd.submit(b, spec))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bd.worker(b, ctx, succeeded("bench\n")); err != nil {
		b.Fatal(err)
	}
	h := bd.srv.Handler()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(spec))
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Errorf("status %d: %s", w.Code, w.Body)
				return
			}
		}
	})
}
