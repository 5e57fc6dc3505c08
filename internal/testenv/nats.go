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
	t    testing.TB
	dir  string
	port int

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts an embedded JetStream server on a free loopback port.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n := &NATS{t: t, dir: t.TempDir(), port: FreePort(t)}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// URL is the client URL.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// StoreDir is the JetStream store directory (kept across Restart).
func (n *NATS) StoreDir() string { return n.dir }

// Start (re)starts the server on the same port and store directory.
func (n *NATS) Start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: n.port, JetStream: true, StoreDir: n.dir,
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

// Restart stops and starts the server, keeping its port and store.
func (n *NATS) Restart() {
	n.Stop()
	n.Start()
}
