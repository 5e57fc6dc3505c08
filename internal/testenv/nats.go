package testenv

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an embedded NATS server with JetStream, owned by one test.
type NATS struct {
	t        testing.TB
	dir      string
	port     int
	maxStore int64 // JetStream's store limit; 0: the server's default (from the disk)

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts an embedded JetStream server on a free loopback port.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	return StartNATSIn(t, t.TempDir())
}

// StartNATSIn is StartNATS with the JetStream store in dir: a small file
// system of the test's, to fill. The server's store limit is set far past
// it (1 TiB), as a server's is for the disk it was given, so that what
// refuses writes is the file system, full, not the server's accounting.
func StartNATSIn(t testing.TB, dir string) *NATS {
	t.Helper()
	n := &NATS{t: t, dir: dir, port: FreePort(t), maxStore: 1 << 40}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// URL is the client URL.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// Start (re)starts the server on the same port and store directory.
func (n *NATS) Start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: n.port, JetStream: true, StoreDir: n.dir, JetStreamMaxStore: n.maxStore,
		NoSigs: true, NoLog: true, ServerName: "kiln-test",
	})
	if err != nil {
		n.t.Fatalf("nats server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		n.t.Fatalf("nats server not ready within 10s")
	}
	n.srv = srv
}

// Stop shuts the server down.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.srv = nil
}

// Interest is how many subscriptions the server holds that a message
// published to subject would reach (0 while it is stopped): a test's signal
// that a client has subscribed, e.g. a long-poll to a job's completion
// notice.
func (n *NATS) Interest(subject string) int {
	n.mu.Lock()
	srv := n.srv
	n.mu.Unlock()
	if srv == nil {
		return 0
	}
	sz, err := srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: subject, Limit: 1024})
	if err != nil {
		return 0
	}
	return len(sz.Subs)
}

// Restart stops and starts the server, keeping its port and store.
func (n *NATS) Restart() {
	n.Stop()
	n.Start()
}
