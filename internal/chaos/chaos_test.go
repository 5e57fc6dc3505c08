package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// The test binary doubles as the processes the test kills:
// KILN_CHAOS_ROLE=nats runs a JetStream server, =api runs the API.
func TestMain(m *testing.M) {
	switch os.Getenv("KILN_CHAOS_ROLE") {
	case "nats":
		os.Exit(natsProcess())
	case "api":
		os.Exit(apiProcess())
	}
	goleak.VerifyTestMain(m)
}

func natsProcess() int {
	port, _ := strconv.Atoi(os.Getenv("KILN_CHAOS_NATS_PORT"))
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: os.Getenv("KILN_CHAOS_NATS_DIR"), NoSigs: true, NoLog: true, ServerName: "kiln-chaos"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		return 1
	}
	srv.WaitForShutdown()
	return 0
}

func apiProcess() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nc, err := nats.Connect(os.Getenv("KILN_CHAOS_NATS_URL"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Error("nats", "error", err)
		return 1
	}
	store, err := cache.Open(ctx, cache.Config{URL: os.Getenv("KILN_CHAOS_REDIS_URL"), Logger: log})
	if err != nil {
		log.Error("redis", "error", err)
		return 1
	}
	srv, err := producer.New(ctx, producer.Config{Store: store, NATS: nc, Logger: log,
		PublishTimeout: time.Second, ReconcileAfter: 2 * time.Second, ReconcileInterval: time.Second})
	if err != nil {
		log.Error("api", "error", err)
		return 1
	}
	go srv.Reconcile(ctx)
	ln, err := net.Listen("tcp", os.Getenv("KILN_CHAOS_API_ADDR"))
	if err != nil {
		log.Error("listen", "error", err)
		return 1
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = hs.Close() }()
	_ = hs.Serve(ln)
	return 0
}

// proc is a child process of this test binary in a role.
type proc struct {
	t    *testing.T
	env  []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	name string
}

func (p *proc) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	p.cmd = cmd
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
}

func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// runCounts counts runs of each job.
type runCounts struct {
	testkit.NoSandbox
	mu sync.Mutex
	n  map[string]int
}

// A run takes 10 ms, or ends with its context (the worker cancels it).
func (r *runCounts) Run(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
	id := req.ID
	r.mu.Lock()
	r.n[id]++
	r.mu.Unlock()
	run := time.NewTimer(10 * time.Millisecond)
	defer run.Stop()
	select {
	case <-run.C:
	case <-ctx.Done():
		return job.Result{}, fmt.Errorf("scripted run of %s: %w", id, ctx.Err())
	}
	return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "ok\n",
		Image: job.Image{Name: "kiln.local/python:latest", Digest: "sha256:chaos"}}, nil
}
func (r *runCounts) Image(context.Context, string) (job.Image, error) {
	return job.Image{Name: "kiln.local/python:latest", Digest: "sha256:chaos"}, nil
}
func (r *runCounts) Runtimes() []string { return []string{"python"} }

// Acceptance: the API is SIGKILLed (and SIGSTOPped, then killed) repeatedly
// and NATS is stalled with SIGSTOP for 1–5 s while 20 clients submit with
// idempotency keys, retrying each submission with its key until it is
// acknowledged. Every acknowledged job completes exactly once, a retried
// key always gets the job id of its first acknowledgement, and nothing is
// left non-terminal.
func TestAPIAndNATSFaultsUnderIdempotentLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	redis := testenv.StartRedis(t)
	natsPort, apiPort := testenv.FreePort(t), testenv.FreePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", apiPort)
	natsProc := &proc{t: t, name: "nats", env: []string{"KILN_CHAOS_ROLE=nats", "KILN_CHAOS_NATS_PORT=" + strconv.Itoa(natsPort), "KILN_CHAOS_NATS_DIR=" + t.TempDir()}}
	apiProc := &proc{t: t, name: "api", env: []string{"KILN_CHAOS_ROLE=api", "KILN_CHAOS_NATS_URL=" + natsURL, "KILN_CHAOS_REDIS_URL=" + redis.URL(), "KILN_CHAOS_API_ADDR=" + apiAddr}}
	natsProc.start()
	t.Cleanup(natsProc.kill)
	apiProc.start()
	t.Cleanup(apiProc.kill)

	// The worker, in this process, on the same stores.
	store, err := cache.New(ctx, cache.Config{URL: redis.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	runs := &runCounts{n: map[string]int{}}
	w, err := worker.New(worker.Config{ID: "chaos", Runtime: runs, Store: store, NATS: nc, Concurrency: 8,
		Queue: queue.Config{AckWait: 2 * time.Second}, IDLease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	defer func() { stopWorker(); <-wdone }()

	base := "http://" + apiAddr
	hc := &http.Client{Timeout: 3 * time.Second}
	testkit.Eventually(t, time.Minute, "the API to serve the python runtime", func() bool {
		resp, err := hc.Get(base + "/v1/runtimes")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(string(body), `"python"`)
	})

	// 20 clients, each submitting one job after another; each submission is
	// retried with its key until acknowledged, then replayed once more.
	submit := func(key, code string) (string, int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/jobs", strings.NewReader(fmt.Sprintf(`{"runtime":"python","code":%q}`, code)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			return "", 0, err
		}
		defer resp.Body.Close()
		var body struct {
			ID string `json:"id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return body.ID, resp.StatusCode, nil
	}
	var mu sync.Mutex
	acked := map[string]string{} // key -> job id
	var problems []string
	stopClients := make(chan struct{})
	var clients sync.WaitGroup
	for c := range 20 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			// A client tries a submission at most every 200 ms.
			pace := time.NewTicker(200 * time.Millisecond)
			defer pace.Stop()
			retry := func() {
				select {
				case <-pace.C:
				case <-ctx.Done():
				}
			}
			for i := 0; ; i++ {
				select {
				case <-stopClients:
					return
				default:
				}
				key := fmt.Sprintf("client-%d-job-%d", c, i)
				code := fmt.Sprintf("print(%q)", key)
				var id string
				for id == "" && ctx.Err() == nil {
					got, status, err := submit(key, code)
					if err == nil && status/100 == 2 && got != "" {
						id = got
						break
					}
					retry()
				}
				if id == "" {
					return
				}
				mu.Lock()
				acked[key] = id
				mu.Unlock()
				// The same key again (a client that lost the answer): same id.
				for ctx.Err() == nil {
					got, status, err := submit(key, code)
					if err != nil || status/100 != 2 {
						retry()
						continue
					}
					if got != id {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("key %s: first id %s, replay id %s", key, id, got))
						mu.Unlock()
					}
					break
				}
			}
		}()
	}

	// Twelve faults, each once the clients have had 10 to 30 more
	// submissions acknowledged since the last: every fault hits a
	// pipeline that recovered from the one before and is under load.
	ackedNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	faults := []string{}
	for i := range 12 {
		want := ackedNow() + 10 + rand.IntN(21)
		testkit.Eventually(t, time.Minute, fmt.Sprintf("%d acknowledged submissions (after %v)", want, faults), func() bool { return ackedNow() >= want })
		switch i % 3 {
		case 0:
			apiProc.kill()
			apiProc.start()
			faults = append(faults, "api SIGKILL")
		case 1:
			apiProc.signal(syscall.SIGSTOP)
			time.Sleep(time.Second)
			apiProc.kill()
			apiProc.start()
			faults = append(faults, "api SIGSTOP 1s, SIGKILL")
		case 2:
			stall := time.Duration(1+rand.IntN(5)) * time.Second
			natsProc.signal(syscall.SIGSTOP)
			time.Sleep(stall)
			natsProc.signal(syscall.SIGCONT)
			faults = append(faults, fmt.Sprintf("nats SIGSTOP %v", stall))
		}
	}
	close(stopClients)
	clients.Wait()
	t.Logf("faults: %s", strings.Join(faults, "; "))

	// Settle: every acknowledged job ends succeeded, having run once.
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d submissions acknowledged", len(acked))
	if len(acked) < 100 {
		t.Errorf("only %d submissions acknowledged in 30 s", len(acked))
	}
	for _, p := range problems {
		t.Error(p)
	}
	terminal := func(id string) (cache.Record, bool, error) {
		rec, err := store.GetJob(ctx, id)
		return rec, err == nil && rec.Status.Terminal(), err
	}
	testkit.Poll(60*time.Second, func() bool {
		for _, id := range acked {
			if _, ok, _ := terminal(id); !ok {
				return false
			}
		}
		return true
	})
	for key, id := range acked {
		switch rec, ok, err := terminal(id); {
		case !ok:
			t.Errorf("key %s job %s not terminal after settling: status %q err %v", key, id, rec.Status, err)
		case rec.Status != job.StatusSucceeded:
			t.Errorf("key %s job %s: %s", key, id, rec.Status)
		}
	}
	runs.mu.Lock()
	defer runs.mu.Unlock()
	ran := map[string]bool{}
	for _, id := range acked {
		ran[id] = true
		if n := runs.n[id]; n != 1 {
			t.Errorf("job %s ran %d times, want exactly once", id, n)
		}
	}
	extra := 0
	for id, n := range runs.n {
		if !ran[id] {
			extra += n
		}
	}
	t.Logf("runs: %d acknowledged jobs ran once each; %d runs of jobs never acknowledged to a client", len(ran), extra)
}
