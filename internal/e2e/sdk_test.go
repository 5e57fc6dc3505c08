package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// sdkAPIKey is the API key the SDK suites use (the harness's API requires one,
// so Unauthorized can be tested).
const sdkAPIKey = "sdk-suite-key"

// sdkHarness is the whole pipeline (API, JetStream, worker, containerd,
// Redis) for the SDKs' own test suites, with an API on a fixed loopback
// address that a suite can take down and bring back, and a NATS server it can
// stop and start, through a small control endpoint ($KILN_TEST_CONTROL):
//
//	POST /api/restart?down=2s  close the API (every connection is cut), start a new one after down
//	POST /nats/stop            stop the NATS server (submissions get 503)
//	POST /nats/start           start it again
//	GET  /api/restarts         how many restarts have completed
type sdkHarness struct {
	e    *env
	t    *testing.T
	addr string // the API's host:port, kept across restarts

	mu       sync.Mutex
	hs       *http.Server
	srv      *producer.Server
	restarts atomic.Int64
	pending  sync.WaitGroup // restarts in progress
	control  string         // the control endpoint's base URL
}

func startSDKHarness(t *testing.T) *sdkHarness {
	t.Helper()
	e := setup(t)
	e.startWorker(t, "e2e-sdk", 2, withImages(map[string]string{"python": pythonImage(t), "node": recipeImage(t, "node")}))
	h := &sdkHarness{e: e, t: t, addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	if err := h.startAPI(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.pending.Wait()
		h.stopAPI()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctl := &http.Server{Handler: h.controlHandler()}
	go func() { _ = ctl.Serve(ln) }()
	t.Cleanup(func() { _ = ctl.Close() })
	h.control = "http://" + ln.Addr().String()
	return h
}

func (h *sdkHarness) startAPI() error {
	ctx := context.Background()
	srv, err := producer.New(ctx, producer.Config{Store: h.e.store, NATS: h.e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, TracerProvider: h.e.tp,
		APIKeys: map[string]string{sdkAPIKey: "sdk-suite"}, RetryAfter: time.Second})
	if err != nil {
		return fmt.Errorf("new API: %w", err)
	}
	var ln net.Listener
	// The old listener's port may take a moment to be free.
	if !testkit.Poll(5*time.Second, func() bool {
		ln, err = net.Listen("tcp", h.addr)
		return err == nil
	}) {
		return fmt.Errorf("listen on %s again: %w", h.addr, err)
	}
	hs := &http.Server{Handler: checkedHandler(h.t, srv.Handler(), "http://"+h.addr)}
	go func() { _ = hs.Serve(ln) }()
	h.mu.Lock()
	h.hs, h.srv = hs, srv
	h.mu.Unlock()
	return nil
}

// stopAPI closes the listener and every open connection at once, as a
// crashing API process would.
func (h *sdkHarness) stopAPI() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hs == nil {
		return
	}
	h.srv.StopLongPolls()
	_ = h.hs.Close()
	h.srv.Close()
	h.hs, h.srv = nil, nil
}

func (h *sdkHarness) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/restart", func(w http.ResponseWriter, r *http.Request) {
		down, err := time.ParseDuration(r.URL.Query().Get("down"))
		if err != nil {
			down = 2 * time.Second
		}
		h.stopAPI()
		// The outage the suite asked for: the new API starts when it ends.
		h.pending.Add(1)
		time.AfterFunc(down, func() {
			defer h.pending.Done()
			if err := h.startAPI(); err != nil {
				h.t.Errorf("restart API: %v", err)
				return
			}
			h.restarts.Add(1)
		})
		fmt.Fprintf(w, "API down for %v\n", down)
	})
	mux.HandleFunc("GET /api/restarts", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d\n", h.restarts.Load())
	})
	mux.HandleFunc("POST /nats/stop", func(w http.ResponseWriter, r *http.Request) {
		h.e.nats.Stop()
		fmt.Fprintln(w, "NATS stopped")
	})
	mux.HandleFunc("POST /nats/start", func(w http.ResponseWriter, r *http.Request) {
		h.e.nats.Start()
		fmt.Fprintln(w, "NATS started")
	})
	return mux
}

// env is the environment an SDK suite runs with: the API's URL and key, the
// control endpoint, and KILN_INTEGRATION passed on (a suite then fails
// instead of skipping when it is "require").
func (h *sdkHarness) environ() []string {
	env := os.Environ()
	return append(env, "KILN_SERVER=http://"+h.addr, "KILN_API_KEY="+sdkAPIKey, "KILN_TEST_CONTROL="+h.control,
		"KILN_INTEGRATION="+os.Getenv("KILN_INTEGRATION"))
}

// runSuite runs an SDK's test command from the repository root, its output
// going to the test log, and fails the test when the command fails.
func (h *sdkHarness) runSuite(t *testing.T, timeout time.Duration, extraEnv []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(h.environ(), extraEnv...)
	out := &testLogWriter{t: t}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	out.flush()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
}

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// testLogWriter sends a child's output to t.Log line by line.
type testLogWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

func (w *testLogWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.t.Log(string(w.buf))
		w.buf = nil
	}
}

var _ io.Writer = (*testLogWriter)(nil)

// lookTool finds a command the SDK suites need, or marks the test
// unavailable (a failure under KILN_INTEGRATION=require).
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Unavailable(t, "%s not in PATH: %v", name, err)
	}
	return p
}

// Acceptance 3 and 5 of the agent-integration issue: the Python SDK's suite
// (with the example agent loop's test) and the TypeScript SDK's suite run
// against the whole pipeline, including an API restart in the middle of a
// wait and a NATS outage during a submit.
func TestSDKs(t *testing.T) {
	h := startSDKHarness(t)
	t.Run("go", func(t *testing.T) { goClientSuite(t, h) })
	t.Run("python", func(t *testing.T) {
		python := debianPython(t)
		h.runSuite(t, 10*time.Minute, []string{"PYTHONPATH=sdk/python", "PYTHONUNBUFFERED=1"},
			python, "-m", "unittest", "discover", "-s", "sdk/python/tests", "-t", "sdk/python", "-v")
	})
	// The example runs as its docstring says: python3 examples/agent_loop.py
	// from the repository root, the SDK not installed.
	t.Run("agent loop example", func(t *testing.T) {
		h.runSuite(t, 2*time.Minute, nil, debianPython(t), "examples/agent_loop.py")
	})
	// The TypeScript SDK ships ESM JavaScript with hand-written .d.ts types, so
	// its suite needs only Node (Debian's nodejs, >= 18 for fetch): no npm, no
	// build step, and the files tested are the files shipped.
	t.Run("typescript", func(t *testing.T) {
		node := lookTool(t, "node")
		h.runSuite(t, 10*time.Minute, nil, node, "--test", "--test-reporter=spec",
			"sdk/typescript/test/unit.test.js", "sdk/typescript/test/stream.test.js", "sdk/typescript/test/live.test.js",
			"sdk/typescript/test/session_files.test.js")
	})
}

// Issue 36, acceptance 5 and 6 (the SDKs' part): a session's files
// round-trip through the Python SDK (sync and async) and the TypeScript SDK,
// and a session pauses and resumes with its files, against the whole
// pipeline: the SDKs' session suites alone (TestSDKs runs them with the
// rest).
func TestSDKSessions(t *testing.T) {
	h := startSDKHarness(t)
	t.Run("python", func(t *testing.T) {
		h.runSuite(t, 5*time.Minute, []string{"PYTHONPATH=sdk/python", "PYTHONUNBUFFERED=1"},
			debianPython(t), "-m", "unittest", "-v", "tests.test_session_files")
	})
	t.Run("typescript", func(t *testing.T) {
		h.runSuite(t, 5*time.Minute, nil, lookTool(t, "node"), "--test", "--test-reporter=spec", "sdk/typescript/test/session_files.test.js")
	})
}

// debianPython is the distribution's python3 (deploy/local/deps.sh installs
// it), the interpreter the SDK promises to support out of the box; a
// python3 elsewhere on PATH (pyenv, a venv) is used only when it is absent.
func debianPython(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return lookTool(t, "python3")
}
