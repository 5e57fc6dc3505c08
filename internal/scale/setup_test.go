package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/worker"
)

// fleet is an API and its workers on one NATS server and one Redis.
type fleet struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *cache.Store
	url   string
	keys  map[string]string // key → tenant
}

// tenantKey is the API key of tenant i.
func tenantKey(i int) string { return fmt.Sprintf("key-of-tenant-%06d", i) }

func tenantName(i int) string { return fmt.Sprintf("tenant-%06d", i) }

// startFleet starts an API serving n tenants (tenantKey(i) → tenantName(i)),
// with settings for some of them.
func startFleet(t *testing.T, n int, tenants map[string]producer.Tenant) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{keys: map[string]string{}}
	for i := range n {
		f.keys[tenantKey(i)] = tenantName(i)
	}
	var err error
	if f.store, err = cache.New(ctx, cache.Config{URL: testenv.StartRedis(t).URL()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.store.Close() })
	if f.nc, err = nats.Connect(testenv.StartNATS(t).URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	if f.js, err = jetstream.New(f.nc); err != nil {
		t.Fatal(err)
	}
	srv, err := producer.New(ctx, producer.Config{Store: f.store, NATS: f.nc, Policy: job.DefaultPolicy(),
		APIKeys: f.keys, Tenants: tenants, RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	f.url = hs.URL
	return f
}

// startWorker runs an in-process worker of python jobs on script. It
// returns once the worker registered its runtime: its queue is set up and it
// pulls.
func (f *fleet) startWorker(t *testing.T, id string, slots int, script func(context.Context, string, job.Spec) (job.Result, error)) {
	t.Helper()
	registered := make(chan struct{})
	var once sync.Once
	hooks := worker.Hooks{Registered: func(ev worker.Event) {
		if ev.Err == nil {
			once.Do(func() { close(registered) })
		}
	}}
	w, err := worker.New(worker.Config{ID: id, Runtime: &testkit.Runtime{Script: script}, Store: f.store,
		NATS: f.nc, Concurrency: slots, Queue: queue.Config{}, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker %s: %v", id, err)
		}
	})
	testkit.Closed(t, registered, 20*time.Second, "worker "+id+" to register its runtime")
}

// submit posts a python job as tenant i and returns its id; ok is false
// with the answer when it was not accepted.
func (f *fleet) submit(client *http.Client, i int, code string) (id string, status int, body string) {
	req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/jobs", bytes.NewBufferString(
		fmt.Sprintf(`{"runtime":"python","code":%q,"cache":false}`, code)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenantKey(i))
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return "", resp.StatusCode, b.String()
	}
	return jsonField(b.Bytes(), "id"), resp.StatusCode, b.String()
}

// consumers counts the consumers of every stream of the queue.
func (f *fleet) consumers(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, name := range []string{job.StreamName, job.ReadyStreamName} {
		s, err := f.js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		for range s.ConsumerNames(context.Background()).Name() {
			out[name]++
		}
	}
	return out
}

// jsonField reads a top-level string field of a JSON object.
func jsonField(b []byte, name string) string {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return ""
	}
	s, _ := m[name].(string)
	return s
}
