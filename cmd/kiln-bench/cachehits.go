package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
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
		Name: "cache",
		// Last: its phase runs after every other section's phase, once
		// each of them is cleaned up (no pool, box or worker of theirs
		// left running), and it waits for the host to quiet.
		Order: 100,
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
// decode it (the first hit was decoded in full). The rate is measured with
// lean clients (leanClient: HTTP/1.1 on a keep-alive connection, no
// goroutine of their own) and, for comparison, with the standard library's
// client. With -cpuprofile, the API's goroutines carry the label
// kiln-bench=api and the clients' kiln-bench=client, so `go tool pprof
// -tagfocus` splits the profile.
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
	// The warm job's worker refills its pool, and the sections cleaned up
	// before this phase leave containerd removing their containers: wait
	// until that has ended, so the phase measures the hits alone.
	quiet, err := waitQuiet(ctx)
	if err != nil {
		return fmt.Errorf("cache hits: %w", err)
	}
	before := p.runs.Load()

	single, _, err := c.loop(ctx, 1, o.CacheTime, c.lean(body, o.CacheTime))
	if err != nil {
		return fmt.Errorf("cache hits: %w", err)
	}
	std, nStd, err := c.loop(ctx, o.CacheClients, o.CacheTime, c.std(body))
	if err != nil {
		return fmt.Errorf("cache hits (net/http client): %w", err)
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
	many, n, err := c.loop(ctx, o.CacheClients, o.CacheTime, c.lean(body, o.CacheTime))
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
	secs := o.CacheTime.Seconds()
	rate := float64(n) / secs
	cores := ""
	if runtime.NumCPU() != 2 {
		cores = fmt.Sprintf(" (this machine has %d)", runtime.NumCPU())
	}
	p99 := quantile(many, 0.99)
	fmt.Printf("\npipeline cache hits: identical %q resubmitted (POST /v1/jobs, no wait), %s each;\n", o.Code, o.CacheTime)
	fmt.Printf("every answer 200 with cache_hit true, 0 sandbox runs; clients share the cores with the API and Redis;\n")
	fmt.Printf("every other section cleaned up first; before measuring, %s\n\n", quiet)
	fmt.Printf("%8s %-9s %10s %10s %10s\n", "clients", "client", "hits/s", "median", "p99")
	fmt.Printf("%8d %-9s %10.0f %10s %10s   target median ≤ %s  %s\n", 1, "lean", float64(len(single))/secs,
		msFine(quantile(single, 0.5)), msFine(quantile(single, 0.99)), ms(cacheHitTarget), mark(quantile(single, 0.5) <= cacheHitTarget))
	fmt.Printf("%8d %-9s %10.0f %10s %10s\n", o.CacheClients, "net/http", float64(nStd)/secs,
		msFine(quantile(std, 0.5)), msFine(quantile(std, 0.99)))
	fmt.Printf("%8d %-9s %10.0f %10s %10s   target ≥ %.0f hits/s on 2 cores%s  %s, p99 ≤ %s  %s\n", o.CacheClients, "lean", rate,
		msFine(quantile(many, 0.5)), msFine(p99), cacheRateTarget, cores, mark(rate >= cacheRateTarget), ms(cacheP99Target), mark(p99 <= cacheP99Target))
	fmt.Println("  lean: one keep-alive connection per client, the request prepared once, each answer's status line,")
	fmt.Println("  headers and body read and checked; net/http: the standard client, its request and buffer reused")
	busy := cpu1 - cpu0
	fmt.Printf("  %d lean clients: host CPU per hit %.1f µs (%.0f%% of the %d cores busy): %s\n",
		o.CacheClients, float64(busy.Microseconds())/float64(n), 100*busy.Seconds()/secs/float64(runtime.NumCPU()), runtime.NumCPU(), cpuSplitMicros(procs1.since(procs0), busy, n))
	fmt.Println("  (kiln-bench is the API, the clients, embedded NATS and the audit log's appends, in one process)")
	return nil
}

// hitClient sends the warmed submission once and returns the answer's
// status and body (valid until its next call).
type hitClient interface {
	hit(ctx context.Context) (int, []byte, error)
	Close() error
}

// newHitClient makes one client of the given kind: "lean" (leanClient) or
// "net/http" (the standard library's client, with a transport of its own).
type newHitClient func(ctx context.Context) (hitClient, error)

// lean makes leanClients whose every request must be answered within
// the measurement (d) and 30 seconds.
func (c *cacheHits) lean(body []byte, d time.Duration) newHitClient {
	return func(ctx context.Context) (hitClient, error) {
		lc, err := dialLean(ctx, strings.TrimPrefix(c.p.base, "http://"), http.MethodPost, "/v1/jobs", body,
			"Content-Type: application/json", "Authorization: Bearer "+c.p.key)
		if err != nil {
			return nil, err
		}
		if err := lc.conn.SetDeadline(time.Now().Add(d + 30*time.Second)); err != nil {
			lc.Close()
			return nil, err
		}
		return leanHits{lc}, nil
	}
}

type leanHits struct{ *leanClient }

func (l leanHits) hit(context.Context) (int, []byte, error) { return l.do() }

// stdHits is one net/http client reusing its request and read buffer.
type stdHits struct {
	hc     *http.Client
	tr     *http.Transport
	req    *http.Request
	body   []byte
	rd     bytes.Reader
	answer bytes.Buffer
}

func (c *cacheHits) std(body []byte) newHitClient {
	return func(ctx context.Context) (hitClient, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.p.base+"/v1/jobs", nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.p.key)
		req.ContentLength = int64(len(body))
		// A transport per client, dialled from the client's goroutine, so
		// its connection's goroutines carry the client's profile label.
		tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}
		return &stdHits{hc: &http.Client{Transport: tr}, tr: tr, req: req, body: body}, nil
	}
}

func (s *stdHits) hit(context.Context) (int, []byte, error) {
	s.rd.Reset(s.body)
	s.req.Body = io.NopCloser(&s.rd)
	resp, err := s.hc.Do(s.req)
	if err != nil {
		return 0, nil, err
	}
	s.answer.Reset()
	_, err = s.answer.ReadFrom(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, s.answer.Bytes(), err
}

func (s *stdHits) Close() error { s.tr.CloseIdleConnections(); return nil }

// loop runs clients that resubmit the warmed spec for d and returns every
// latency (capped, for memory) and the number of hits.
func (c *cacheHits) loop(ctx context.Context, clients int, d time.Duration, dial newHitClient) ([]time.Duration, int, error) {
	const keep = 1 << 20
	var mu sync.Mutex
	var lat []time.Duration
	var hits int
	var err error
	pprof.Do(ctx, pprof.Labels("kiln-bench", "client"), func(ctx context.Context) {
		end := time.Now().Add(d)
		err = fanOut(ctx, clients, func(ctx context.Context) error {
			hc, err := dial(ctx)
			if err != nil {
				return err
			}
			defer hc.Close()
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
				status, answer, err := hc.hit(ctx)
				if err != nil {
					return fmt.Errorf("POST /v1/jobs: %w", err)
				}
				mine = append(mine, time.Since(t))
				if status != http.StatusOK || !bytes.Contains(answer, []byte(`"cache_hit":true`)) {
					return fmt.Errorf("status %d, want a cache hit: %s", status, answer)
				}
				n++
			}
			return nil
		})
	})
	return lat, hits, err
}
