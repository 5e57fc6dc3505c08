package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/localnet"
	"github.com/kilnrun/kiln/internal/testkit"
)

// Redis is a redis-server process owned by one test.
type Redis struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRedis starts a fresh redis-server on a free loopback port, stopped at test end.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server not in PATH (apt-get install redis-server)")
	}
	r := &Redis{t: t, bin: bin, dir: t.TempDir(), port: FreePort(t)}
	t.Cleanup(r.Stop) // first: a server that does not answer ends the test
	r.Start()
	return r
}

// URL is the go-redis URL of the server.
func (r *Redis) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// Addr is host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start (re)starts the server on the same port; it returns once PING answers.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return
	}
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--dir", r.dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	r.cmd = cmd
	if testkit.Poll(10*time.Second, func() bool { return localnet.RedisPing(context.Background(), r.Addr()) == nil }) {
		return
	}
	log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	r.t.Fatalf("redis-server did not answer PING on %s within 10s; log:\n%s", r.Addr(), log)
}

// Stop kills the server (data survives in its append-only file for the next Start).
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// RestartEmpty kills the server, deletes its data (a restart without
// persistence, or a failover to a replica that had nothing) and starts it
// again on the same port.
func (r *Redis) RestartEmpty() {
	r.t.Helper()
	r.Stop()
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		r.t.Fatalf("redis data dir: %v", err)
	}
	for _, e := range entries {
		if e.Name() != "redis.log" {
			if err := os.RemoveAll(filepath.Join(r.dir, e.Name())); err != nil {
				r.t.Fatalf("wipe redis data: %v", err)
			}
		}
	}
	r.Start()
}
