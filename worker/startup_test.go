package worker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/producer"
)

// Acceptance: a worker and an API started while NATS and Redis are both
// down come up once the stores are started, and their /readyz says so: 503
// naming the missing dependencies before, 200 after, and a job submitted
// through the API then runs. A fast in-process test with a scripted runtime;
// internal/e2e.TestAPIAndWorkerStartWithStoresDown runs the real `kiln api`
// and `kiln worker` commands and a real sandbox.
func TestWorkerAndAPIStartWithStoresDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := testenv.StartRedis(t)
	r.Stop()
	n := testenv.StartNATS(t)
	n.Stop()

	// Connected as `kiln api` and `kiln worker` connect.
	connect := func(name string) (*nats.Conn, *cache.Store) {
		nc, err := nats.Connect(n.URL(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			t.Fatalf("%s: nats connect with the server down: %v", name, err)
		}
		t.Cleanup(nc.Close)
		store, err := cache.Open(ctx, cache.Config{URL: r.URL()})
		if err != nil {
			t.Fatalf("%s: cache.Open with redis down: %v", name, err)
		}
		t.Cleanup(func() { _ = store.Close() })
		return nc, store
	}
	apiNC, apiStore := connect("api")
	srv, err := producer.New(ctx, producer.Config{Store: apiStore, NATS: apiNC})
	if err != nil {
		t.Fatalf("producer.New with the stores down: %v", err)
	}
	t.Cleanup(srv.Close)
	api := httptest.NewServer(srv.Handler())
	t.Cleanup(api.Close)

	wNC, wStore := connect("worker")
	w, err := New(Config{ID: "w-startup", Runtime: &testkit.Runtime{Script: testkit.Succeed}, Store: wStore, NATS: wNC, Concurrency: 1, StoreProbe: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		if err, ok := <-done; ok && err != nil {
			t.Errorf("worker.Run: %v", err)
		}
	})
	health := httptest.NewServer(w.HealthHandler())
	t.Cleanup(health.Close)

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for name, url := range map[string]string{"api": api.URL + "/readyz", "worker": health.URL + "/readyz"} {
		code, body := get(url)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"redis":"unavailable`) && !strings.Contains(body, `"redis":"waiting`) {
			t.Fatalf("%s /readyz with the stores down: %d %s", name, code, body)
		}
		t.Logf("%s /readyz with the stores down: %d %s", name, code, body)
	}
	if code, _ := get(health.URL + "/healthz"); code != http.StatusOK {
		t.Fatalf("worker /healthz: %d", code)
	}
	// The worker keeps retrying its stores rather than giving up.
	testkit.Quiet(t, done, 500*time.Millisecond, "the worker exiting with its stores down")

	started := time.Now()
	n.Start()
	r.Start()
	for name, url := range map[string]string{"api": api.URL + "/readyz", "worker": health.URL + "/readyz"} {
		testkit.Eventually(t, 20*time.Second, name+" ready", func() bool { code, _ := get(url); return code == http.StatusOK })
		_, body := get(url)
		t.Logf("%s ready %v after the stores started: %s", name, time.Since(started).Round(time.Millisecond), body)
	}

	// The API serves: a submission runs on the worker.
	var sub struct {
		ID string `json:"id"`
	}
	testkit.Eventually(t, 10*time.Second, "a submission accepted", func() bool { // the worker's runtime registration may trail its readiness
		resp, err := http.Post(api.URL+"/v1/jobs", "application/json", strings.NewReader(`{"runtime":"python","code":"print(1)"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return false
		}
		return json.NewDecoder(resp.Body).Decode(&sub) == nil
	})
	testkit.Eventually(t, 10*time.Second, "the job to succeed", func() bool {
		_, body := get(api.URL + "/v1/jobs/" + sub.ID)
		return strings.Contains(body, `"status":"succeeded"`)
	})
}
