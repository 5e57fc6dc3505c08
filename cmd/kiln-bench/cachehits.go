package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Targets of the cache-hit phase. A miss is printed, not fatal.
const (
	cacheHitTarget  = 2 * time.Millisecond // cache-hit submit median, one client
	cacheRateTarget = 15000.0              // cache hits per second, many clients, on 2 cores
	cacheP99Target  = 5 * time.Millisecond // cache-hit submit p99, many clients
)

func init() {
	c := &cacheHits{}
	register(section{
		Name:  "cache",
		Order: 2, // its phase runs after the pipeline's throughput
		Setup: c.setup,
		Phase: c.phase,
	})
}

// cacheHits is the cache-hit phase: a pipeline of its own (its own Redis,
// NATS and worker), no rows, and a phase that resubmits one warmed spec.
// `-only cache` runs it alone.
type cacheHits struct{ p *pipeline }

func (c *cacheHits) setup(ctx context.Context, o *options) ([]row, func(), error) {
	if !o.Pipeline || o.CacheTime <= 0 {
		return nil, nil, nil
	}
	c.p = &pipeline{name: "cache pipeline"}
	_, cleanup, err := c.p.setup(ctx, &options{Pipeline: true, Code: o.Code})
	if err != nil {
		return nil, nil, err
	}
	return nil, cleanup, nil
}

// phase warms one result, checks that resubmitting it is a cache hit, then
// measures hit latency from one client and the hit rate from many. Every
// answer must be 200 with cache_hit true, and the sandbox must not run.
//
// The clients run in this process, on the same cores as the API and Redis,
// so their CPU is the API's loss: they keep their connections, requests and
// read buffers, and look for "cache_hit":true in the answer rather than
// decode it (the first hit was decoded in full). With -cpuprofile, the
// API's goroutines carry the label kiln-bench=api and the clients'
// kiln-bench=client, so `go tool pprof -tagfocus` splits the profile.
func (c *cacheHits) phase(ctx context.Context, o *options) error {
	if c.p == nil {
		return nil
	}
	p := c.p
	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code})
	if err != nil {
		return err
	}
	if res, err := p.submitWait(ctx, body); err != nil {
		return fmt.Errorf("cache hits: warm: %w", err)
	} else if res.Status != job.StatusSucceeded {
		return fmt.Errorf("cache hits: warm: job %s: status %s: %s", res.ID, res.Status, res.Stderr)
	}
	res, err := p.submitWait(ctx, body)
	if err != nil {
		return fmt.Errorf("cache hits: first hit: %w", err)
	}
	if !res.CacheHit || res.Status != job.StatusSucceeded {
		return fmt.Errorf("cache hits: resubmitting the warmed spec: status %s, cache_hit %v; want a succeeded cache hit", res.Status, res.CacheHit)
	}
	before := p.runs.Load()

	single, _, err := c.loop(ctx, 1, o.CacheTime, body)
	if err != nil {
		return fmt.Errorf("cache hits: %w", err)
	}
	stop, err := startProfiles(o.CPUProfile, o.MemProfile, ".cache")
	if err != nil {
		return err
	}
	procs0 := procCPU()
	cpu0, err := hostCPU()
	if err != nil {
		stop()
		return err
	}
	many, n, err := c.loop(ctx, o.CacheClients, o.CacheTime, body)
	cpu1, cerr := hostCPU()
	procs1 := procCPU()
	stop()
	if err != nil {
		return fmt.Errorf("cache hits: %w", err)
	}
	if cerr != nil {
		return cerr
	}
	if ran := p.runs.Load() - before; ran != 0 {
		return fmt.Errorf("cache hits: the sandbox ran %d times while every answer was a cache hit", ran)
	}
	rate := float64(n) / o.CacheTime.Seconds()
	cores := ""
	if runtime.NumCPU() != 2 {
		cores = fmt.Sprintf(" (this machine has %d)", runtime.NumCPU())
	}
	p99 := quantile(many, 0.99)
	fmt.Printf("\npipeline cache hits: identical %q resubmitted (POST /v1/jobs, no wait), %s each;\n", o.Code, o.CacheTime)
	fmt.Printf("every answer 200 with cache_hit true, 0 sandbox runs; clients share the cores with the API and Redis\n\n")
	fmt.Printf("%8s %10s %10s %10s\n", "clients", "hits/s", "median", "p99")
	fmt.Printf("%8d %10.0f %10s %10s   target median ≤ %s  %s\n", 1, float64(len(single))/o.CacheTime.Seconds(),
		msFine(quantile(single, 0.5)), msFine(quantile(single, 0.99)), ms(cacheHitTarget), mark(quantile(single, 0.5) <= cacheHitTarget))
	fmt.Printf("%8d %10.0f %10s %10s   target ≥ %.0f hits/s on 2 cores%s  %s, p99 ≤ %s  %s\n", o.CacheClients, rate,
		msFine(quantile(many, 0.5)), msFine(p99), cacheRateTarget, cores, mark(rate >= cacheRateTarget), ms(cacheP99Target), mark(p99 <= cacheP99Target))
	busy := cpu1 - cpu0
	fmt.Printf("  host CPU per hit %.1f µs (%.0f%% of the %d cores busy): %s\n", float64(busy.Microseconds())/float64(n),
		100*busy.Seconds()/o.CacheTime.Seconds()/float64(runtime.NumCPU()), runtime.NumCPU(), cpuSplitMicros(procs0, procs1, busy, n))
	fmt.Println("  (kiln-bench is the API, the clients, embedded NATS and the audit log's appends, in one process)")
	return nil
}

// loop runs clients that resubmit body for d and returns every latency
// (capped, for memory) and the number of hits.
func (c *cacheHits) loop(ctx context.Context, clients int, d time.Duration, body []byte) ([]time.Duration, int, error) {
	const keep = 1 << 20
	var mu sync.Mutex
	var lat []time.Duration
	var hits int
	// A transport of its own, dialled from the clients' goroutines, so its
	// connections' goroutines carry the clients' profile label too.
	tr := &http.Transport{Proxy: nil, MaxIdleConns: clients, MaxIdleConnsPerHost: clients, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var err error
	pprof.Do(ctx, pprof.Labels("kiln-bench", "client"), func(ctx context.Context) {
		end := time.Now().Add(d)
		err = fanOut(ctx, clients, func(ctx context.Context) error {
			mine := make([]time.Duration, 0, 4096)
			n := 0
			defer func() {
				mu.Lock()
				hits += n
				lat = append(lat, mine[:min(len(mine), keep-len(lat))]...)
				mu.Unlock()
			}()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.p.base+"/v1/jobs", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+c.p.key)
			req.ContentLength = int64(len(body))
			var rd bytes.Reader
			var answer bytes.Buffer
			for time.Now().Before(end) {
				t := time.Now()
				rd.Reset(body)
				req.Body = io.NopCloser(&rd)
				resp, err := hc.Do(req)
				if err != nil {
					return fmt.Errorf("POST /v1/jobs: %w", err)
				}
				answer.Reset()
				_, err = answer.ReadFrom(resp.Body)
				resp.Body.Close()
				if err != nil {
					return fmt.Errorf("POST /v1/jobs: read answer: %w", err)
				}
				mine = append(mine, time.Since(t))
				if resp.StatusCode != http.StatusOK || !bytes.Contains(answer.Bytes(), []byte(`"cache_hit":true`)) {
					return fmt.Errorf("status %d, want a cache hit: %s", resp.StatusCode, answer.Bytes())
				}
				n++
			}
			return nil
		})
	})
	return lat, hits, err
}

// startProfiles starts a CPU profile into cpu+suffix and takes the
// allocation profile's base into mem+suffix+".base" (each when its name is
// set); stop ends the CPU profile and writes the allocation profile to
// mem+suffix. The allocation counts are cumulative since the process
// started: `go tool pprof -sample_index=alloc_space -base mem.base mem`
// reads what the measurement allocated.
func startProfiles(cpu, mem, suffix string) (stop func(), err error) {
	writeAllocs := func(file string) {
		runtime.GC() // the profile holds the allocations up to the last GC
		f, err := os.Create(file)
		if err == nil {
			err = pprof.Lookup("allocs").WriteTo(f, 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kiln-bench: allocation profile:", err)
		}
	}
	if mem != "" {
		writeAllocs(mem + suffix + ".base")
	}
	stopCPU := func() {}
	if cpu != "" {
		if stopCPU, err = startCPUProfile(cpu + suffix); err != nil {
			return nil, err
		}
	}
	return func() {
		stopCPU()
		if mem != "" {
			writeAllocs(mem + suffix)
		}
	}, nil
}
