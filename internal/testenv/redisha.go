package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/internal/localnet"
	"github.com/kilnrun/kiln/internal/testkit"
)

// SentinelMaster is the master name RedisHA's Sentinels monitor.
const SentinelMaster = "kiln"

// Replication credentials: the replica authenticates as replUser, so a test
// can cut it off the primary (ACL SETUSER off) and open a replication gap.
const (
	replUser = "kiln-repl"
	replPass = "kiln-repl-pw"
)

// RedisHA is a Redis primary, one replica and three Sentinels (Debian's
// redis-sentinel) on loopback, owned by one test (StartRedisPair: the two
// servers alone). Servers are index 0 (the first primary) and 1 (the first
// replica).
type RedisHA struct {
	t         testing.TB
	server    string // redis-server binary
	servers   [2]*haProc
	sentinels [3]*haProc
}

type haProc struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (p *haProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// StartRedisHA starts the five processes and waits until the replica is in
// sync and every Sentinel knows the replica and the two other Sentinels, so
// a failover can happen.
func StartRedisHA(t testing.TB) *RedisHA {
	t.Helper()
	sentinel, err := exec.LookPath("redis-sentinel")
	if err != nil {
		Unavailable(t, "redis-sentinel not in PATH (apt-get install redis-sentinel)")
	}
	h := startServers(t)
	primary := h.servers[0]
	for i := range h.sentinels {
		s := &haProc{port: FreePort(t), dir: t.TempDir()}
		h.sentinels[i] = s
		conf := filepath.Join(s.dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, s.port, s.dir, filepath.Join(s.dir, "sentinel.log"), SentinelMaster, primary.port,
			SentinelMaster, SentinelMaster, SentinelMaster)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		h.start(s, sentinel, conf)
	}
	h.waitReady(60 * time.Second)
	return h
}

// StartRedisPair starts a primary (server 0) and its replica (server 1),
// without Sentinels, and waits until the replica is in sync.
func StartRedisPair(t testing.TB) *RedisHA {
	t.Helper()
	h := startServers(t)
	h.waitReady(60 * time.Second)
	return h
}

func startServers(t testing.TB) *RedisHA {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server not in PATH (apt-get install redis-server)")
	}
	h := &RedisHA{t: t, server: server}
	t.Cleanup(h.stopAll)
	for i := range h.servers {
		h.servers[i] = &haProc{port: FreePort(t), dir: t.TempDir()}
	}
	h.startServer(0)
	h.startServer(1, "--replicaof", "127.0.0.1", strconv.Itoa(h.servers[0].port))
	return h
}

// startServer starts server i without persistence (a restart comes back
// empty). Both servers know the replication user and authenticate with it
// when they are a replica, so either can replicate from the other after a
// failover.
func (h *RedisHA) startServer(i int, extra ...string) {
	h.t.Helper()
	p := h.servers[i]
	h.start(p, h.server, append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--dir", p.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(p.dir, "redis.log"),
		"--masteruser", replUser, "--masterauth", replPass,
		// A replica's first sync starts at once, not after the default
		// 5 s wait for more replicas (a loaded host already stretched it
		// past waitReady's bound).
		"--repl-diskless-sync-delay", "0"}, extra...)...)
	c := redis.NewClient(&redis.Options{Addr: p.addr(), DialTimeout: time.Second})
	err := c.Do(context.Background(), "ACL", "SETUSER", replUser, "on", ">"+replPass, "+psync", "+replconf", "+ping").Err()
	c.Close()
	if err != nil {
		h.t.Fatalf("create the replication user on %s: %v", p.addr(), err)
	}
}

// RestartServer starts server i again after KillServer, empty, as an
// operator brings a dead primary back: the Sentinels then make it a replica
// of the primary they promoted.
func (h *RedisHA) RestartServer(i int) {
	h.t.Helper()
	if h.servers[i].cmd != nil {
		return
	}
	h.startServer(i)
}

// InSync reports whether server i is a replica whose link to its primary is up.
func (h *RedisHA) InSync(ctx context.Context, i int) bool {
	rc := redis.NewClient(&redis.Options{Addr: h.servers[i].addr(), DialTimeout: time.Second})
	info, err := rc.Info(ctx, "replication").Result()
	rc.Close()
	return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
}

func (h *RedisHA) start(p *haProc, bin string, args ...string) {
	h.t.Helper()
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start %s: %v", bin, err)
	}
	p.cmd = cmd
	if !testkit.Poll(10*time.Second, func() bool { return localnet.RedisPing(context.Background(), p.addr()) == nil }) {
		log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
		slog, _ := os.ReadFile(filepath.Join(p.dir, "sentinel.log"))
		h.t.Fatalf("%s on %s did not answer PING within 10s; log:\n%s%s", bin, p.addr(), log, slog)
	}
}

func (h *RedisHA) stopAll() {
	for _, p := range append(h.sentinels[:], h.servers[:]...) {
		if p != nil && p.cmd != nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
			p.cmd = nil
		}
	}
}

// SentinelAddrs are the Sentinels' host:port addresses.
func (h *RedisHA) SentinelAddrs() []string {
	var a []string
	for _, s := range h.sentinels {
		if s != nil {
			a = append(a, s.addr())
		}
	}
	return a
}

// ServerAddr is server i's host:port (0: the first primary, 1: the first replica).
func (h *RedisHA) ServerAddr(i int) string { return h.servers[i].addr() }

// Primary asks a Sentinel which server is the primary now.
func (h *RedisHA) Primary(ctx context.Context) (string, error) {
	var last error
	for _, s := range h.sentinels {
		if s == nil || s.cmd == nil {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
		a, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		sc.Close()
		if err == nil && len(a) == 2 {
			return net.JoinHostPort(a[0], a[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("no sentinel names a primary for %s: %w", SentinelMaster, last)
}

// KillServer SIGKILLs server i.
func (h *RedisHA) KillServer(i int) {
	p := h.servers[i]
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// CutReplica makes the primary (server 0) drop its replica's link and refuse
// it back, as a lagging or partitioned replica would be: from now on writes
// the primary acknowledges reach no replica.
func (h *RedisHA) CutReplica(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: h.servers[0].addr(), DialTimeout: time.Second})
	defer c.Close()
	if err := c.Do(ctx, "ACL", "SETUSER", replUser, "off").Err(); err != nil {
		return fmt.Errorf("disable the replication user: %w", err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "USER", replUser).Err(); err != nil {
		return fmt.Errorf("drop the replica's link: %w", err)
	}
	return nil
}

// ReconnectReplica undoes CutReplica: the primary (server 0) lets the
// replica back in, and it reconnects within about a second (ask InSync).
func (h *RedisHA) ReconnectReplica(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: h.servers[0].addr(), DialTimeout: time.Second})
	defer c.Close()
	if err := c.Do(ctx, "ACL", "SETUSER", replUser, "on").Err(); err != nil {
		return fmt.Errorf("enable the replication user: %w", err)
	}
	return nil
}

// waitReady waits until the replica is in sync and every Sentinel sees the
// replica and both other Sentinels.
func (h *RedisHA) waitReady(within time.Duration) {
	h.t.Helper()
	ctx := context.Background()
	why := ""
	if !testkit.Poll(within, func() bool {
		why = h.notReady(ctx)
		return why == ""
	}) {
		log, _ := os.ReadFile(filepath.Join(h.servers[1].dir, "redis.log"))
		h.t.Fatalf("redis HA not ready within %v: %s; the replica's log ends:\n%s", within, why, tail(log, 2048))
	}
}

func (h *RedisHA) notReady(ctx context.Context) string {
	if !h.InSync(ctx, 1) {
		return "replica not in sync"
	}
	for _, s := range h.sentinels {
		if s == nil {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), DialTimeout: time.Second})
		reps, err1 := sc.Replicas(ctx, SentinelMaster).Result()
		sens, err2 := sc.Sentinels(ctx, SentinelMaster).Result()
		sc.Close()
		if err1 != nil || err2 != nil {
			return fmt.Sprintf("sentinel %s: %v %v", s.addr(), err1, err2)
		}
		if len(reps) != 1 || len(sens) != 2 {
			return fmt.Sprintf("sentinel %s knows %d replicas and %d sentinels", s.addr(), len(reps), len(sens))
		}
	}
	return ""
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
