package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/callback"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// Acceptance 10: callbacks through the whole pipeline (API, JetStream, a
// worker process on containerd, Redis, the deliverer), with a receiver in the test.

const (
	cbKey    = "acme-api-key"
	cbTenant = "acme"
)

var cbSecret = []byte("acme-callback-secret")

// cbEnv is an API with authentication and callbacks on, over e's stores.
type cbEnv struct {
	*env
	url    string
	policy callback.Policy
}

func setupCallbacks(t *testing.T) *cbEnv {
	t.Helper()
	e := setup(t)
	nets, err := callback.ParseNetworks([]string{"127.0.0.0/8"}) // the test's receivers are on loopback
	if err != nil {
		t.Fatal(err)
	}
	policy := callback.Policy{Guard: callback.NewGuard(nets), Secrets: func(tenant string) ([]byte, bool) {
		return cbSecret, tenant == cbTenant
	}}
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, APIKeys: map[string]string{cbKey: cbTenant},
		Callbacks: policy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	return &cbEnv{env: e, url: hs.URL, policy: policy}
}

// startDeliverer runs the API's callback deliverer; stop ends it, as an API restart would.
func (e *cbEnv) startDeliverer(t *testing.T) (stop func()) {
	t.Helper()
	d, err := callback.New(callback.Config{NATS: e.nc, Store: e.store, Queue: testQueue, Guard: e.policy.Guard,
		Secrets: e.policy.Secrets, RetryInitial: 100 * time.Millisecond, RetryMax: 400 * time.Millisecond, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("deliverer: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// submit posts spec and returns the HTTP status and decoded body.
func (e *cbEnv) submit(t *testing.T, spec map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(spec)
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/jobs", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+cbKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// callbackOf reads the job's "callback" object through GET /v1/jobs/{id}.
func (e *cbEnv) callbackOf(t *testing.T, id string) (status string, cb job.CallbackState) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/jobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+cbKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status   string            `json:"status"`
		Callback job.CallbackState `json:"callback"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Status, body.Callback
}

func (e *cbEnv) waitCallback(t *testing.T, id string, within time.Duration, cond func(job.CallbackState) bool) job.CallbackState {
	t.Helper()
	var cb job.CallbackState
	if !testkit.Poll(within, func() bool {
		_, cb = e.callbackOf(t, id)
		return cond(cb)
	}) {
		t.Fatalf("job %s: callback %+v; condition not met within %v", id, cb, within)
	}
	return cb
}

// hook is a receiver answering codes in turn (the last one from then on),
// verifying every signature.
type hook struct {
	t     *testing.T
	mu    sync.Mutex
	codes []int
	got   chan job.Result
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := callback.Verify(cbSecret, r.Header.Get(job.HeaderSignature), body, time.Now(), time.Minute); err != nil {
		h.t.Errorf("receiver: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var res job.Result
	if err := json.Unmarshal(body, &res); err != nil || res.ID != r.Header.Get(job.HeaderJobID) {
		h.t.Errorf("receiver: body %s (job id header %q): %v", body, r.Header.Get(job.HeaderJobID), err)
	}
	h.mu.Lock()
	code := h.codes[0]
	if len(h.codes) > 1 {
		h.codes = h.codes[1:]
	}
	h.mu.Unlock()
	w.WriteHeader(code)
	if code < 300 {
		h.got <- res
	}
}

func newHook(t *testing.T, codes ...int) *hook {
	return &hook{t: t, codes: codes, got: make(chan job.Result, 4)}
}

func TestCallbacks(t *testing.T) {
	e := setupCallbacks(t)
	stopDeliverer := e.startDeliverer(t)
	victim := e.workerProc(t, "cb-worker-1")

	t.Run("private address refused with 422 saying why", func(t *testing.T) {
		for url, why := range map[string]string{
			"http://10.20.30.40/hook":       "10.20.30.40 is a private address",
			"http://169.254.169.254/latest": "169.254.169.254 is a link-local address",
			"http://[fd00::1]:8080/hook":    "fd00::1 is a private address",
			"ftp://example.com/hook":        "scheme",
		} {
			status, body := e.submit(t, map[string]any{"code": "print(1)", "callback_url": url})
			detail, _ := body["detail"].(string)
			if status != http.StatusUnprocessableEntity || body["field"] != "callback_url" || !strings.Contains(detail, why) {
				t.Errorf("%s: %d %v; want 422 on callback_url saying %q", url, status, body, why)
			}
		}
	})

	t.Run("signed delivery", func(t *testing.T) {
		h := newHook(t, 200)
		srv := httptest.NewServer(h)
		defer srv.Close()
		status, body := e.submit(t, map[string]any{"code": "print('called back')", "cache": false, "callback_url": srv.URL + "/kiln"})
		if status != http.StatusAccepted {
			t.Fatalf("submit: %d %v", status, body)
		}
		id := body["id"].(string)
		select {
		case res := <-h.got:
			if res.ID != id || res.Status != job.StatusSucceeded || res.Stdout != "called back\n" {
				t.Errorf("callback body %+v", res)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("no callback within 60s")
		}
		cb := e.waitCallback(t, id, 10*time.Second, func(c job.CallbackState) bool { return c.State == job.CallbackDelivered })
		if cb.Attempts != 1 || cb.LastStatus != 200 || cb.URL != srv.URL+"/kiln" {
			t.Errorf("callback state %+v", cb)
		}
	})

	t.Run("500 three times then 200: delivered on the fourth try", func(t *testing.T) {
		h := newHook(t, 500, 500, 500, 200)
		srv := httptest.NewServer(h)
		defer srv.Close()
		status, body := e.submit(t, map[string]any{"code": "print(4)", "cache": false, "callback_url": srv.URL})
		if status != http.StatusAccepted {
			t.Fatalf("submit: %d %v", status, body)
		}
		id := body["id"].(string)
		select {
		case <-h.got:
		case <-time.After(60 * time.Second):
			t.Fatal("no successful callback within 60s")
		}
		cb := e.waitCallback(t, id, 10*time.Second, func(c job.CallbackState) bool { return c.State == job.CallbackDelivered })
		if cb.Attempts != 4 || cb.LastStatus != 200 {
			t.Errorf("delivered after %d attempts; want 4 (%+v)", cb.Attempts, cb)
		}
	})

	t.Run("receiver down across a worker kill and an API restart", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // the receiver is down: connections are refused
		status, body := e.submit(t, map[string]any{"code": "import time; time.sleep(1.5); print('late')", "cache": false,
			"callback_url": "http://" + addr + "/hook"})
		if status != http.StatusAccepted {
			t.Fatalf("submit: %d %v", status, body)
		}
		id := body["id"].(string)
		if _, cb := e.callbackOf(t, id); cb.State != job.CallbackPending || cb.Attempts != 0 {
			t.Errorf("a queued job's callback is %+v; want pending, no attempt", cb)
		}
		// Kill the worker while the job runs; a new worker runs it again.
		e.waitRecord(t, id, 60*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
		if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = victim.Wait()
		e.workerProc(t, "cb-worker-2")
		cb := e.waitCallback(t, id, 60*time.Second, func(c job.CallbackState) bool { return c.Attempts >= 2 })
		if cb.State != job.CallbackPending || !strings.Contains(cb.LastError, "refused") || cb.NextAttemptAt == nil {
			t.Errorf("while the receiver is down: %+v", cb)
		}
		// The API (its deliverer) restarts, then the receiver comes up.
		stopDeliverer()
		e.startDeliverer(t)
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h := newHook(t, 200)
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
		srv.Start()
		defer srv.Close()
		select {
		case res := <-h.got:
			if res.ID != id || res.Stdout != "late\n" {
				t.Errorf("callback body %+v", res)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no callback within 30s of the receiver coming up")
		}
		cb = e.waitCallback(t, id, 10*time.Second, func(c job.CallbackState) bool { return c.State == job.CallbackDelivered })
		if cb.Attempts < 3 {
			t.Errorf("delivered state %+v", cb)
		}
	})
}
