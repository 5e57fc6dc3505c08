package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// apiEnv is a real API server on real Redis and NATS, with a stand-in for
// a Kiln worker (work) so jobs can finish without containerd.
type apiEnv struct {
	URL   string
	store *cache.Store
	nc    *nats.Conn
	js    jetstream.JetStream
	stops []func()
}

func (e *apiEnv) Close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
}

func newAPIEnv(redisURL, natsURL string, keys map[string]string, mod ...func(*producer.Config)) (*apiEnv, error) {
	ctx := context.Background()
	e := &apiEnv{}
	var err error
	if e.store, err = cache.New(ctx, cache.Config{URL: redisURL}); err != nil {
		return nil, err
	}
	e.stops = append(e.stops, func() { _ = e.store.Close() })
	if e.nc, err = nats.Connect(natsURL); err != nil {
		e.Close()
		return nil, err
	}
	e.stops = append(e.stops, e.nc.Close)
	if e.js, err = jetstream.New(e.nc); err != nil {
		e.Close()
		return nil, err
	}
	info := job.RuntimeInfo{Name: "python", Image: "kiln/python:3", Digest: "sha256:abc", Limits: job.DefaultPolicy()}
	if err := e.store.RegisterRuntime(ctx, info, time.Hour); err != nil {
		e.Close()
		return nil, err
	}
	cfg := producer.Config{Store: e.store, NATS: e.nc, JetStream: e.js, APIKeys: keys}
	for _, m := range mod {
		m(&cfg)
	}
	srv, err := producer.New(ctx, cfg)
	if err != nil {
		e.Close()
		return nil, err
	}
	hs := httptest.NewServer(srv.Handler())
	e.stops = append(e.stops, srv.Close, hs.Close)
	e.URL = hs.URL
	return e, nil
}

// startEnv is newAPIEnv on testenv's servers.
func startEnv(t testing.TB, keys map[string]string) *apiEnv {
	t.Helper()
	r, n := testenv.StartRedis(t), testenv.StartNATS(t)
	e, err := newAPIEnv(r.URL(), n.URL(), keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// work does what a Kiln worker does with the next python job: mark it
// running, finish it with stdout, cache the result, ack, publish the
// completion notice.
func (e *apiEnv) work(ctx context.Context, stdout string, exit int) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := queue.NewPicker(e.js, queue.Config{}, "python").Wait(wctx)
	if err != nil {
		return fmt.Errorf("no job message within 30s: %w", err)
	}
	var msg job.Message
	if err := json.Unmarshal(m.Data(), &msg); err != nil {
		return err
	}
	if _, err := e.store.MarkRunningLeased(ctx, msg.ID, "example-worker", 1, time.Now(), cache.Lease{Token: "example-worker/1"}); err != nil {
		return err
	}
	res := job.Result{ID: msg.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(exit), Attempt: 1, Worker: "example-worker"}
	if exit != 0 {
		res.Status, res.Error = job.StatusFailed, job.NewFailure(job.CategoryRuntimeError, "exit status "+strconv.Itoa(exit))
	}
	res.SetOutput([]byte(stdout), nil)
	now := time.Now().UTC()
	res.FinishedAt = &now
	if _, err := e.store.Finish(ctx, msg.ID, res); err != nil {
		return err
	}
	if err := e.store.StoreResult(ctx, msg.Key, res); err != nil {
		return err
	}
	if err := m.Ack(); err != nil {
		return err
	}
	notice, _ := json.Marshal(map[string]string{"id": msg.ID, "status": string(res.Status)})
	return e.nc.Publish(job.DoneSubject(msg.ID), notice)
}

// startExampleEnv starts its own redis-server and embedded NATS for the
// examples, which have no testing.T.
func startExampleEnv() (*apiEnv, error) {
	dir, err := os.MkdirTemp("", "kiln-example-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	redisCmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := redisCmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("nats not ready")
	}
	redisURL := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	var e *apiEnv
	// redis-server needs a moment to listen.
	if !testkit.Poll(10*time.Second, func() bool {
		e, err = newAPIEnv(redisURL, ns.ClientURL(), nil)
		return err == nil
	}) {
		return nil, err
	}
	e.stops = append([]func(){func() { _ = os.RemoveAll(dir) }, func() { _ = redisCmd.Process.Kill(); _ = redisCmd.Wait() }, ns.Shutdown}, e.stops...)
	return e, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
