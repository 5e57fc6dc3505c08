package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/job"
)

// load is the pipeline's phase after the round-robin: throughput at several
// client concurrencies, then cache-hit latency and rate.
func (p *pipeline) load(ctx context.Context, o *options) error {
	if !o.Pipeline {
		return nil
	}
	if o.ThroughputJobs > 0 && len(o.ThroughputConc) > 0 {
		if err := p.throughput(ctx, o); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if o.CacheTime > 0 {
		if err := p.cacheHits(ctx, o); err != nil {
			return fmt.Errorf("cache hits: %w", err)
		}
	}
	return nil
}

// throughput submits a fixed number of cache-off jobs per level, from as
// many clients as the level says, each waiting for its job's result. A first
// line calls the worker's sandbox directly from as many goroutines as the
// worker has slots: the ceiling the pipeline can at best reach.
func (p *pipeline) throughput(ctx context.Context, o *options) error {
	spec := job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()}
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	n := o.ThroughputJobs
	fmt.Printf("\npipeline throughput: %d jobs per line, cache off; worker concurrency %d (= cores)\n\n", n, p.slots)
	fmt.Printf("%-34s %8s %10s %10s %10s\n", "path", "clients", "jobs/s", "median", "p99")
	line := func(path string, clients int, run func(ctx context.Context) error) error {
		rate, lat, err := jobsAt(ctx, clients, n, run)
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", path, clients, err)
		}
		fmt.Printf("%-34s %8d %10.1f %10s %10s\n", path, clients, rate, ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)))
		return nil
	}
	err = line("sandbox.Run only (no pipeline)", p.slots, func(ctx context.Context) error {
		res, err := p.sb.Run(ctx, job.NewID(), spec)
		if err == nil && res.Status != job.StatusSucceeded {
			err = fmt.Errorf("status %s: %s", res.Status, res.Stderr)
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, c := range o.ThroughputConc {
		before := p.runs.Load()
		err := line("pipeline (POST ?wait=30s)", c, func(ctx context.Context) error {
			res, err := p.submitWait(ctx, body)
			if err == nil && (res.Status != job.StatusSucceeded || res.CacheHit) {
				err = fmt.Errorf("job %s: status %s, cache_hit %v: %s", res.ID, res.Status, res.CacheHit, res.Stderr)
			}
			return err
		})
		if err != nil {
			return err
		}
		if ran := p.runs.Load() - before; ran != int64(n) {
			return fmt.Errorf("%d clients: %d jobs answered but the sandbox ran %d times", c, n, ran)
		}
	}
	return nil
}

// jobsAt runs n jobs from clients goroutines and returns jobs per second
// and each job's latency.
func jobsAt(ctx context.Context, clients, n int, run func(ctx context.Context) error) (float64, []time.Duration, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	start := time.Now()
	err := fanOut(ctx, clients, func(ctx context.Context) error {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return nil
			}
			t := time.Now()
			if err := run(ctx); err != nil {
				return err
			}
			lat[i] = time.Since(t)
		}
	})
	return float64(n) / time.Since(start).Seconds(), lat, err
}

// cacheHits warms one result, checks that resubmitting it is a cache hit,
// then measures hit latency from one client and the hit rate from many.
// Every answer must be 200 with cache_hit true, and the sandbox must not run.
func (p *pipeline) cacheHits(ctx context.Context, o *options) error {
	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code})
	if err != nil {
		return err
	}
	if res, err := p.submitWait(ctx, body); err != nil {
		return fmt.Errorf("warm: %w", err)
	} else if res.Status != job.StatusSucceeded {
		return fmt.Errorf("warm: job %s: status %s: %s", res.ID, res.Status, res.Stderr)
	}
	res, err := p.submitWait(ctx, body)
	if err != nil {
		return fmt.Errorf("first hit: %w", err)
	}
	if !res.CacheHit || res.Status != job.StatusSucceeded {
		return fmt.Errorf("resubmitting the warmed spec: status %s, cache_hit %v; want a succeeded cache hit", res.Status, res.CacheHit)
	}
	before := p.runs.Load()

	single, _, err := p.hitLoop(ctx, 1, o.CacheTime, body)
	if err != nil {
		return err
	}
	stopProfile := func() {}
	if o.CPUProfile != "" {
		if stopProfile, err = startCPUProfile(o.CPUProfile + ".cache"); err != nil {
			return err
		}
	}
	many, n, err := p.hitLoop(ctx, o.CacheClients, o.CacheTime, body)
	stopProfile()
	if err != nil {
		return err
	}
	if ran := p.runs.Load() - before; ran != 0 {
		return fmt.Errorf("the sandbox ran %d times while every answer was a cache hit", ran)
	}
	rate := float64(n) / o.CacheTime.Seconds()
	cores := ""
	if runtime.NumCPU() != 2 {
		cores = fmt.Sprintf(" (this machine has %d)", runtime.NumCPU())
	}
	fmt.Printf("\npipeline cache hits: identical %q resubmitted (POST /v1/jobs, no wait), %s each;\n", o.Code, o.CacheTime)
	fmt.Printf("every answer 200 with cache_hit true, 0 sandbox runs; clients share the cores with the API and Redis\n\n")
	fmt.Printf("%8s %10s %10s %10s\n", "clients", "hits/s", "median", "p99")
	fmt.Printf("%8d %10.0f %10s %10s   target median ≤ %s  %s\n", 1, float64(len(single))/o.CacheTime.Seconds(),
		msFine(quantile(single, 0.5)), msFine(quantile(single, 0.99)), ms(cacheHitTarget), mark(quantile(single, 0.5) <= cacheHitTarget))
	fmt.Printf("%8d %10.0f %10s %10s   target ≥ %.0f hits/s on 2 cores%s  %s\n", o.CacheClients, rate,
		msFine(quantile(many, 0.5)), msFine(quantile(many, 0.99)), cacheRateTarget, cores, mark(rate >= cacheRateTarget))
	return nil
}

// hitLoop runs clients that resubmit body for d and returns every latency
// (capped, for memory) and the number of hits.
func (p *pipeline) hitLoop(ctx context.Context, clients int, d time.Duration, body []byte) ([]time.Duration, int, error) {
	const keep = 1 << 20
	var mu sync.Mutex
	var lat []time.Duration
	var hits int
	end := time.Now().Add(d)
	err := fanOut(ctx, clients, func(ctx context.Context) error {
		mine := make([]time.Duration, 0, 4096)
		n := 0
		defer func() {
			mu.Lock()
			hits += n
			lat = append(lat, mine[:min(len(mine), keep-len(lat))]...)
			mu.Unlock()
		}()
		for time.Now().Before(end) {
			t := time.Now()
			status, b, err := p.do(ctx, http.MethodPost, "/v1/jobs", body)
			if err != nil {
				return err
			}
			mine = append(mine, time.Since(t))
			// A byte search rather than a decode: the client's CPU is the
			// server's CPU here, and the first hit was decoded in full.
			if status != http.StatusOK || !bytes.Contains(b, []byte(`"cache_hit":true`)) {
				return fmt.Errorf("status %d, want a cache hit: %s", status, b)
			}
			n++
		}
		return nil
	})
	return lat, hits, err
}

// fanOut runs f in n goroutines; the first error cancels the others.
func fanOut(ctx context.Context, n int, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// msFine is ms with two decimals, for sub-millisecond latencies.
func msFine(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}
