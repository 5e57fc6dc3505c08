package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

var fastRetry = client.WithRetry(client.RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 50, MaxElapsed: 20 * time.Second})

// The first try of a submission reaches the real API, which queues the job,
// but its answer is lost (the connection is cut). The retry carries the same
// Idempotency-Key and gets the same job: one job is queued, not two.
func TestSubmitRetryAfterALostAnswerMakesNoSecondJob(t *testing.T) {
	t.Parallel()
	e := startEnv(t, nil)
	var mu sync.Mutex
	var keys, firstIDs []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, e.URL+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		first := len(keys) == 1
		if first {
			var v struct{ ID string }
			_ = json.Unmarshal(answer, &v)
			firstIDs = append(firstIDs, v.ID)
		}
		mu.Unlock()
		if first { // the job is queued; the client never hears of it
			conn, _, _ := w.(http.Hijacker).Hijack()
			_ = conn.Close()
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(proxy.Close)
	c, err := client.New(proxy.URL, fastRetry)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := c.Submit(ctx, job.Spec{Code: "print('once')", Cache: job.CacheOff()})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Keys of the tries: %q (want two, equal, not empty)", keys)
	}
	if sub.ID != firstIDs[0] {
		t.Fatalf("retry answered job %s, the lost answer was job %s", sub.ID, firstIDs[0])
	}
	st, err := e.js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("queued messages: %+v %v (want 1)", info.State, err)
	}
}

// NATS is down: a submission without retries gets ErrUnavailable with a
// Retry-After; one with retries is accepted once NATS is back.
func TestSubmitRetriesThroughAQueueOutage(t *testing.T) {
	t.Parallel()
	r, n := testenv.StartRedis(t), testenv.StartNATS(t)
	// A short Retry-After, so the client's honouring it takes little time.
	e, err := newAPIEnv(r.URL(), n.URL(), nil, func(c *producer.Config) { c.RetryAfter = 100 * time.Millisecond })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n.Stop()
	once, _ := client.New(e.URL, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	_, err = once.Submit(ctx, job.Spec{Code: "print(1)"})
	var apiErr *client.Error
	if !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &apiErr) || apiErr.RetryAfter <= 0 {
		t.Fatalf("submit while NATS is down: %v (want ErrUnavailable with Retry-After)", err)
	}
	watch := newWatched()
	c, _ := client.New(e.URL, fastRetry, watch.option())
	type answer struct {
		sub client.Submission
		err error
	}
	done := make(chan answer, 1)
	go func() {
		sub, err := c.Submit(ctx, job.Spec{Code: "print('after the outage')"})
		done <- answer{sub, err}
	}()
	// Refused twice (the second try honoured the first's Retry-After), the
	// submission is still being retried.
	watch.await(t, http.StatusServiceUnavailable, 2, "503 answers while NATS is down")
	select {
	case a := <-done:
		t.Fatalf("submit ended while NATS was down: %+v %v", a.sub, a.err)
	default:
	}
	n.Start()
	a := <-done
	if a.err != nil || !a.sub.Accepted {
		t.Fatalf("submit after the outage: %+v %v", a.sub, a.err)
	}
}

// restartableAPI serves a fresh producer.Server for e on a fixed address,
// counting long-polls, and can be closed (cutting every connection) and
// started again.
type restartableAPI struct {
	e     *apiEnv
	addr  string
	polls atomic.Int64
	hs    *http.Server
	srv   *producer.Server
}

func (a *restartableAPI) start(t *testing.T) {
	t.Helper()
	srv, err := producer.New(context.Background(), producer.Config{Store: a.e.store, NATS: a.e.nc, JetStream: a.e.js})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	// The old listener's port may take a moment to be free.
	if !testkit.Poll(5*time.Second, func() bool {
		ln, err = net.Listen("tcp", a.addr)
		return err == nil
	}) {
		t.Fatal(err)
	}
	a.addr = ln.Addr().String()
	h := srv.Handler()
	a.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("wait") != "" {
			a.polls.Add(1)
		}
		h.ServeHTTP(w, r)
	})}
	a.hs.RegisterOnShutdown(srv.StopLongPolls)
	a.srv = srv
	go func() { _ = a.hs.Serve(ln) }()
}

func (a *restartableAPI) stop() {
	_ = a.hs.Close()
	a.srv.Close()
}

// The API goes away in the middle of a long-poll and comes back a second
// later: Wait carries on and returns the result.
func TestWaitSurvivesAnAPIRestart(t *testing.T) {
	t.Parallel()
	e := startEnv(t, nil)
	api := &restartableAPI{e: e, addr: "127.0.0.1:0"}
	api.start(t)
	t.Cleanup(api.stop)
	watch := newWatched()
	c, err := client.New("http://"+api.addr, fastRetry, watch.option())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sub, err := c.Submit(ctx, job.Spec{Code: "print('restart')"})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		v   client.JobView
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := c.Wait(ctx, sub.ID)
		done <- answer{v, err}
	}()
	testkit.Eventually(t, 30*time.Second, "a long-poll to reach the API", func() bool { return api.polls.Load() > 0 })
	api.stop()
	// The wait finds the API gone, twice, before it comes back.
	watch.await(t, 0, 2, "requests to the stopped API to fail")
	api.start(t)
	if err := e.work(ctx, "restart\n", 0); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.v.Status != job.StatusSucceeded || a.v.Stdout != "restart\n" {
		t.Fatalf("Wait across a restart: %+v %v", a.v, a.err)
	}
	if n := api.polls.Load(); n < 2 {
		t.Fatalf("%d long-polls: the wait was not resumed after the restart", n)
	}
}

func TestProblemTypesMatchWithErrorsIs(t *testing.T) {
	t.Parallel()
	e := startEnv(t, map[string]string{"key-1": "tests"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon, _ := client.New(e.URL)
	c, _ := client.New(e.URL, client.WithAPIKey("key-1"))
	_, err := anon.Runtimes(ctx)
	check := func(name string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v is not %v", name, err, want)
		}
		var apiErr *client.Error
		if !errors.As(err, &apiErr) {
			t.Errorf("%s: %v is not an *Error", name, err)
		}
	}
	check("no key", err, client.ErrUnauthorized)
	_, err = c.Submit(ctx, job.Spec{Code: "print(1)", Limits: job.Limits{MemoryMB: 1 << 20}})
	check("limit", err, client.ErrInvalidField)
	if errors.Is(err, client.ErrNotFound) {
		t.Errorf("an invalid-field error matched ErrNotFound")
	}
	_, err = c.Get(ctx, job.NewID(), 0)
	check("unknown job", err, client.ErrNotFound)
	_, err = c.Get(ctx, "nope", 0)
	check("bad id", err, client.ErrInvalidID)
	_, err = c.Batch(ctx, make([]job.Spec, 101))
	check("big batch", err, client.ErrBatchTooLarge)
	if _, err := c.Submit(ctx, job.Spec{Code: "print('a')"}, client.WithIdempotencyKey("k-is")); err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(ctx, job.Spec{Code: "print('b')"}, client.WithIdempotencyKey("k-is"))
	check("reused key", err, client.ErrIdempotencyKeyReused)
	_, err = c.Submit(ctx, job.Spec{Code: "print('net')", Network: &job.Network{Allow: []string{"api.example.org"}}})
	check("egress", err, client.ErrEgressNotAllowed)
}

func TestWaitAll(t *testing.T) {
	t.Parallel()
	e := startEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _ := client.New(e.URL)
	var ids []string
	for i := range 3 {
		sub, err := c.Submit(ctx, job.Spec{Code: fmt.Sprintf("print(%d)", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sub.ID)
	}
	go func() {
		for range 3 {
			if err := e.work(ctx, "done\n", 0); err != nil {
				t.Errorf("work: %v", err)
				return
			}
		}
	}()
	views, err := c.WaitAll(ctx, ids)
	if err != nil || len(views) != 3 {
		t.Fatalf("WaitAll: %v %v", views, err)
	}
	for i, v := range views {
		if v.ID != ids[i] || v.Status != job.StatusSucceeded {
			t.Errorf("job %d: %s %s (want %s succeeded)", i, v.ID, v.Status, ids[i])
		}
	}
	_, err = c.WaitAll(ctx, []string{ids[0], job.NewID()})
	if !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("WaitAll with an unknown id: %v", err)
	}
}
