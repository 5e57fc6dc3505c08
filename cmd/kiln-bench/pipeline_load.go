package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// load is the pipeline's phase after the round-robin: throughput at several
// client concurrencies.
func (p *pipeline) load(ctx context.Context, o *options) error {
	if !o.Pipeline {
		return nil
	}
	if o.ThroughputJobs > 0 && len(o.ThroughputConc) > 0 {
		if err := p.throughput(ctx, o); err != nil {
			return fmt.Errorf("throughput: %w", err)
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
		res, err := p.sb.Run(ctx, sandbox.Request{ID: job.NewID(), Spec: spec})
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
