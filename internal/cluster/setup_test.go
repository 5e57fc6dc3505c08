package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/worker"
)

func TestMain(m *testing.M) {
	testenv.NATSNodeMain() // a child started by StartNATSCluster runs a node and exits here
	goleak.VerifyTestMain(m)
}

// loadJobs is how many jobs a load test submits (KILN_CLUSTER_JOBS, default 500).
func loadJobs(t *testing.T) int {
	if v := os.Getenv("KILN_CLUSTER_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("KILN_CLUSTER_JOBS=%q", v)
		}
		return n
	}
	return 500
}

// runs counts sandbox runs per job id across the test's workers.
type runs struct {
	mu sync.Mutex
	by map[string]int
	n  atomic.Int64
}

func (r *runs) of(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[id]
}

// scriptedRuntime stands in for the sandbox: these tests are about the
// queue and the stores, not containerd (internal/e2e runs the real sandbox).
// A run takes runTime and prints what print(N) would, counted per job id.
type scriptedRuntime struct {
	testkit.NoSandbox
	r       *runs
	runTime time.Duration
}

func (c scriptedRuntime) Run(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
	id, spec := req.ID, req.Spec
	c.r.mu.Lock()
	c.r.by[id]++
	c.r.mu.Unlock()
	c.r.n.Add(1)
	select {
	case <-time.After(c.runTime):
	case <-ctx.Done():
		return job.Result{}, fmt.Errorf("scripted run of %s: %w", id, ctx.Err())
	}
	out := strings.TrimSuffix(strings.TrimPrefix(spec.Code, "print("), ")") + "\n"
	return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: out, StdoutBytes: int64(len(out)),
		WallMS: c.runTime.Milliseconds(), Image: scriptedImage}, nil
}

var scriptedImage = job.Image{Name: "kiln.local/python:latest", Digest: "sha256:scripted"}

func (scriptedRuntime) Image(context.Context, string) (job.Image, error) { return scriptedImage, nil }
func (scriptedRuntime) Runtimes() []string                               { return []string{"python"} }

// pipeline is an API and workers over the given NATS URLs and Redis store.
type pipeline struct {
	url   string
	store *cache.Store
	runs  *runs

	mu       sync.Mutex
	accepted []string // ids answered 202 so far, in order
}

// acceptedSoFar is a copy of the ids accepted so far.
func (p *pipeline) acceptedSoFar() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.accepted...)
}

func connect(t *testing.T, urls, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// warnLog keeps the workers' warnings (failed acks and fetches during a
// failover) in the test's output and leaves out a line per job.
var warnLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// startPipeline starts the API and `workers` workers of `slots` slots each,
// whose scripted runs take runTime.
func startPipeline(t *testing.T, natsURLs string, store *cache.Store, q queue.Config, workers, slots int, runTime time.Duration) *pipeline {
	t.Helper()
	return startPipelineWith(t, natsURLs, store, store, q, workers, slots, runTime)
}

// startPipelineWith is startPipeline whose workers use wstore (store seen
// through a wrapper that counts).
func startPipelineWith(t *testing.T, natsURLs string, store *cache.Store, wstore worker.Store, q queue.Config, workers, slots int, runTime time.Duration) *pipeline {
	t.Helper()
	ctx := context.Background()
	p := &pipeline{store: store, runs: &runs{by: map[string]int{}}}
	srv, err := producer.New(ctx, producer.Config{Store: store, NATS: connect(t, natsURLs, "kiln-api"), Queue: q,
		RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	p.url = hs.URL
	for i := range workers {
		id := fmt.Sprintf("cluster-w%d", i+1)
		w, err := worker.New(worker.Config{ID: id, Runtime: scriptedRuntime{r: p.runs, runTime: runTime}, Store: wstore,
			NATS: connect(t, natsURLs, id), Concurrency: slots, Queue: q, Heartbeat: 500 * time.Millisecond,
			Logger: warnLog})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker %s: %v", id, err)
			}
		})
	}
	testkit.Eventually(t, 30*time.Second, "a worker to register a runtime", func() bool {
		rts, err := store.Runtimes(ctx)
		return err == nil && len(rts) > 0
	})
	return p
}

// submitted is what the load's client saw for one job.
type submitted struct {
	id      string
	retries int // answers other than 202 before the 202
	ids     map[string]bool
}

// submitAll submits n trivial jobs from 8 clients, about perSecond jobs a
// second in all (so submissions go on through the faults), each with an
// Idempotency-Key, retrying any failure (5xx, 429, connection errors) with
// the same key until the API answers 202, as a careful client does.
func (p *pipeline) submitAll(t *testing.T, n, perSecond int) []submitted {
	t.Helper()
	out := make([]submitted, n)
	next := atomic.Int64{}
	// The load's rate: the clients take turns at one tick per submission.
	rate := time.NewTicker(time.Second / time.Duration(perSecond))
	defer rate.Stop()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				out[i] = p.submitOne(t, i)
				<-rate.C
			}
		}()
	}
	wg.Wait()
	return out
}

func (p *pipeline) submitOne(t *testing.T, i int) submitted {
	s := submitted{ids: map[string]bool{}}
	body, _ := json.Marshal(map[string]any{"code": fmt.Sprintf("print(%d)", i), "cache": false})
	// Tries at most every 200 ms, for up to two minutes.
	pace := time.NewTicker(200 * time.Millisecond)
	defer pace.Stop()
	accepted := testkit.Poll(2*time.Minute, func() bool {
		if s.retries > 0 {
			<-pace.C
		}
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/jobs", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("load-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var v struct {
				ID string `json:"id"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if v.ID != "" {
				s.ids[v.ID] = true
			}
			if resp.StatusCode == http.StatusAccepted {
				s.id = v.ID
				p.mu.Lock()
				p.accepted = append(p.accepted, v.ID)
				p.mu.Unlock()
				return true
			}
		}
		s.retries++
		return false
	})
	if !accepted {
		t.Errorf("job %d: not accepted within 2 minutes", i)
	}
	return s
}

// settle waits until every job is terminal or within has passed, and
// returns the ids still not terminal.
func (p *pipeline) settle(t *testing.T, subs []submitted, within time.Duration) []string {
	t.Helper()
	var ids []string
	for _, s := range subs {
		if s.id != "" {
			ids = append(ids, s.id)
		}
	}
	var open []string
	testkit.Poll(within, func() bool {
		open = nil
		recs, err := p.store.GetJobs(context.Background(), ids)
		if err != nil {
			open = ids
			return false
		}
		for i, r := range recs {
			if r == nil || !r.Status.Terminal() {
				open = append(open, ids[i])
			}
		}
		return len(open) == 0
	})
	return open
}
