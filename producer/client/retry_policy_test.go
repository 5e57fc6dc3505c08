package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// scripted is an httptest server answering each request with the next of
// its answers (the last one repeats), recording when each request came and
// its Idempotency-Key.
type scripted struct {
	*httptest.Server
	mu    sync.Mutex
	at    []time.Time
	keys  []string
	steps []func(w http.ResponseWriter)
}

func newScripted(t *testing.T, steps ...func(w http.ResponseWriter)) *scripted {
	s := &scripted{steps: steps}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		n := len(s.at)
		s.at = append(s.at, time.Now())
		s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
		step := s.steps[min(n, len(s.steps)-1)]
		s.mu.Unlock()
		step(w)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

func problem(status int, typ job.ProblemType, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"type":"` + string(typ) + `","title":"t","status":0,"detail":"d"}`))
	}
}

func accepted(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"id":"01J00000000000000000000000","status":"queued"}`))
}

// hangUp cuts the connection without an answer, after the request arrived.
func hangUp(w http.ResponseWriter) {
	conn, _, _ := w.(http.Hijacker).Hijack()
	_ = conn.Close()
}

// A 429 with Retry-After: 1 is retried no sooner than a second later, with
// the same Idempotency-Key, however short the policy's own back-off.
func TestSubmitHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(429, job.ProblemQueueFull, "1"), accepted)
	c, _ := client.New(s.URL, client.WithRetry(client.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	sub, err := c.Submit(context.Background(), job.Spec{Code: "print(1)"})
	if err != nil || !sub.Accepted {
		t.Fatalf("Submit: %+v %v", sub, err)
	}
	if s.requests() != 2 {
		t.Fatalf("%d requests, want 2", s.requests())
	}
	if gap := s.at[1].Sub(s.at[0]); gap < time.Second {
		t.Fatalf("retried after %v, before the server's Retry-After of 1s", gap)
	}
	if s.keys[0] == "" || s.keys[0] != s.keys[1] {
		t.Fatalf("Idempotency-Keys %q: want one key, reused", s.keys)
	}
}

// Answers that will not change are returned at once, as their sentinel.
func TestSubmitDoesNotRetryPermanentErrors(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(422, job.ProblemInvalidField, ""))
	c, _ := client.New(s.URL)
	_, err := c.Submit(context.Background(), job.Spec{Code: "print(1)"})
	if !errors.Is(err, client.ErrInvalidField) || s.requests() != 1 {
		t.Fatalf("Submit: %v after %d requests (want ErrInvalidField after 1)", err, s.requests())
	}
}

// MaxAttempts bounds the tries; the last error is returned.
func TestSubmitGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(503, job.ProblemUnavailable, ""))
	c, _ := client.New(s.URL, client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}))
	_, err := c.Submit(context.Background(), job.Spec{Code: "print(1)"})
	if !errors.Is(err, client.ErrUnavailable) || s.requests() != 3 {
		t.Fatalf("Submit: %v after %d requests (want ErrUnavailable after 3)", err, s.requests())
	}
}

// A connection cut after the request arrived is retried for Submit (it has
// an idempotency key) but not for Batch (a retry could make the jobs twice).
func TestBatchIsNotRetriedWhenTheRequestMayHaveArrived(t *testing.T) {
	t.Parallel()
	s := newScripted(t, hangUp, hangUp, accepted)
	c, _ := client.New(s.URL, client.WithRetry(client.RetryPolicy{InitialBackoff: time.Millisecond}))
	if _, err := c.Batch(context.Background(), []job.Spec{{Code: "print(1)"}}); err == nil || s.requests() != 1 {
		t.Fatalf("Batch: %v after %d requests (want an error after 1)", err, s.requests())
	}
	if sub, err := c.Submit(context.Background(), job.Spec{Code: "print(1)"}); err != nil || !sub.Accepted || s.requests() != 3 {
		t.Fatalf("Submit: %+v %v after %d requests (want accepted after 2 more)", sub, err, s.requests())
	}
}

// Nothing listens yet: the connection is refused, and the retries carry on
// until the API is up.
func TestSubmitRetriesARefusedConnection(t *testing.T) {
	t.Parallel()
	// A socket bound to the port but not listening: connections to it are
	// refused, and nothing else on the host can take the port meanwhile.
	closeFd, addr := boundNotListening(t)
	watch := newWatched()
	c, _ := client.New("http://"+addr, watch.option(), client.WithRetry(client.RetryPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}))
	done := make(chan error, 1)
	go func() {
		_, err := c.Batch(context.Background(), []job.Spec{{Code: "print(1)"}})
		done <- err
	}()
	watch.await(t, 0, 2, "two refused connections") // retried once at least
	closeFd()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jobs":[{"index":0,"status":202,"job":{"id":"01J00000000000000000000000","status":"queued"}}]}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	if err := <-done; err != nil {
		t.Fatalf("Batch once the API is up: %v", err)
	}
}

// boundNotListening binds a TCP socket to a free loopback port without
// listening on it, and returns its close (also run at cleanup; it closes
// once) and its address.
func boundNotListening(t *testing.T) (func(), string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		t.Fatal(err)
	}
	var once sync.Once
	closeFd := func() { once.Do(func() { _ = syscall.Close(fd) }) }
	t.Cleanup(closeFd)
	return closeFd, net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
