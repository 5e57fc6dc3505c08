package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

const testDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// bundle is a Server on real Redis and NATS plus the collaborators a test
// needs to look behind it.
type bundle struct {
	srv    *Server
	http   *httptest.Server
	store  *cache.Store
	redis  *testenv.Redis
	rdb    *redis.Client
	nats   *testenv.NATS
	nc     *nats.Conn
	js     jetstream.JetStream
	spans  *tracetest.InMemoryExporter
	apiKey string
}

// awaitLongPoll waits until a long-poll on job id is subscribed to its
// completion notice (the server's own signal that it is waiting).
func (b *bundle) awaitLongPoll(t testing.TB, id string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "a long-poll on job "+id, func() bool { return b.nats.Interest(job.DoneSubject(id)) > 0 })
}

// setup starts redis-server and an embedded NATS, registers the "python"
// runtime, and serves a Server over httptest. mod adjusts the Config.
func setup(t testing.TB, mod ...func(*Config)) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{redis: testenv.StartRedis(t), nats: testenv.StartNATS(t)}
	var err error
	b.store, err = cache.New(ctx, cache.Config{URL: b.redis.URL()})
	if err != nil {
		t.Fatalf("cache.New: %v", err)
	}
	t.Cleanup(func() { _ = b.store.Close() })
	b.rdb = redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	t.Cleanup(func() { _ = b.rdb.Close() })
	b.nc, err = nats.Connect(b.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(b.nc.Close)
	if b.js, err = jetstream.New(b.nc); err != nil {
		t.Fatal(err)
	}
	registerPython(t, b.store, testDigest)
	b.spans = tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(b.spans))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	cfg := Config{Store: b.store, NATS: b.nc, JetStream: b.js, TracerProvider: tp, RuntimeCacheTTL: 50 * time.Millisecond}
	for _, m := range mod {
		m(&cfg)
	}
	for k := range cfg.APIKeys {
		b.apiKey = k
	}
	b.srv, err = New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(b.srv.Close)
	b.http = httptest.NewServer(b.srv.Handler())
	t.Cleanup(b.http.Close)
	return b
}

func registerPython(t testing.TB, s *cache.Store, digest string) {
	t.Helper()
	info := job.RuntimeInfo{Name: "python", Image: "kiln/python:3", Digest: digest, Limits: job.DefaultPolicy()}
	if err := s.RegisterRuntime(context.Background(), info, time.Hour); err != nil {
		t.Fatalf("register runtime: %v", err)
	}
}

// response is an HTTP answer with its body read.
type response struct {
	*http.Response
	body []byte
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %d answer %q: %v", r.StatusCode, r.body, err)
	}
}

// problemBody is what tests read from an application/problem+json answer.
type problemBody struct {
	Type   string            `json:"type"`
	Title  string            `json:"title"`
	Status int               `json:"status"`
	Detail string            `json:"detail"`
	Field  string            `json:"field"`
	Limit  int64             `json:"limit"`
	Checks map[string]string `json:"checks"`
}

// problem asserts that r is a problem with status and returns it.
func (r response) problem(t testing.TB, status int) problemBody {
	t.Helper()
	if r.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", r.StatusCode, status, r.body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, r.body)
	}
	var p problemBody
	r.decode(t, &p)
	if p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Fatalf("incomplete problem: %s", r.body)
	}
	return p
}

func (b *bundle) do(t testing.TB, method, path, body string, hdr ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.apiKey)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{Response: resp, body: raw}
}

func (b *bundle) submit(t testing.TB, spec string, hdr ...string) response {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/jobs", spec, hdr...)
}

// accepted asserts a 202 answer and returns its body.
func accepted(t testing.TB, r response) pendingView {
	t.Helper()
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202; body %s", r.StatusCode, r.body)
	}
	var v pendingView
	r.decode(t, &v)
	if !job.ValidID(v.ID) {
		t.Fatalf("answer has no valid id: %s", r.body)
	}
	return v
}

// streamMsgs is the number of messages waiting in KILN_JOBS.
func (b *bundle) streamMsgs(t testing.TB) uint64 {
	t.Helper()
	s, err := b.js.Stream(context.Background(), job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// jobKeys counts job records and in-flight claims in Redis.
func (b *bundle) jobKeys(t testing.TB) (records, claims int) {
	t.Helper()
	ctx := context.Background()
	recs, err := b.rdb.Keys(ctx, cache.PrefixDefault+"job:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := b.rdb.Keys(ctx, cache.PrefixDefault+"inflight:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(recs), len(cl)
}

// worker acts as a Kiln worker for one job: it takes the next message of the
// python consumer, marks the job running, finishes it with run's result,
// caches it, acks, and publishes the completion notice.
func (b *bundle) worker(t testing.TB, ctx context.Context, run func(job.Message) job.Result) (job.Message, error) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := queue.NewPicker(b.js, queue.Config{}, "python").Wait(wctx)
	if err != nil {
		return job.Message{}, fmt.Errorf("no job message within 5s: %w", err)
	}
	var msg job.Message
	if err := json.Unmarshal(m.Data(), &msg); err != nil {
		return msg, err
	}
	if _, err := b.store.MarkRunningLeased(ctx, msg.ID, "test-worker", 1, time.Now(), cache.Lease{Token: "test-worker/1"}); err != nil {
		return msg, err
	}
	res := run(msg)
	res.ID, res.Attempt, res.Worker = msg.ID, 1, "test-worker"
	now := time.Now().UTC()
	res.FinishedAt = &now
	if _, err := b.store.Finish(ctx, msg.ID, res); err != nil {
		return msg, err
	}
	if msg.Spec.CacheEnabled() {
		if err := b.store.StoreResult(ctx, msg.Key, res); err != nil {
			return msg, err
		}
	}
	if err := m.Ack(); err != nil {
		return msg, err
	}
	notice, _ := json.Marshal(map[string]string{"id": msg.ID, "status": string(res.Status)})
	return msg, b.nc.Publish(job.DoneSubject(msg.ID), notice)
}

func succeeded(stdout string) func(job.Message) job.Result {
	return func(job.Message) job.Result {
		r := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), WallMS: 12}
		r.SetOutput([]byte(stdout), nil)
		return r
	}
}

func jsonBody(t testing.TB, v any) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
