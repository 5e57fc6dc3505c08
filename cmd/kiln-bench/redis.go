package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kilnrun/kiln/internal/localnet"
)

// privateRedis is a redis-server child process on a free loopback port with
// its data in dir, so benchmark records never mix with a user's Redis.
type privateRedis struct {
	cmd    *exec.Cmd
	exited chan struct{}
	dir    string
	port   int
}

// startRedis starts redis-server with the persistence deploy/local/redis.sh
// gives a local install (append-only file, fsync every second), minus RDB
// snapshots, whose forks would only add noise. It returns once the server
// answers PING.
func startRedis(ctx context.Context, dir string) (*privateRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server: %w (run `make deps`, or -pipeline=false to skip the pipeline rows)", err)
	}
	port, err := localnet.FreePort()
	if err != nil {
		return nil, err
	}
	r := &privateRedis{dir: dir, port: port, exited: make(chan struct{})}
	r.cmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
		"--appendonly", "yes", "--save", "")
	// Its own process group keeps a terminal's Ctrl-C from killing it before
	// the worker has drained; Pdeathsig keeps it from outliving a killed bench.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()

	// Raw PINGs until it answers: go-redis would log every refused dial.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := localnet.RedisPing(ctx, r.addr())
		if err == nil {
			return r, nil
		}
		select {
		case <-r.exited:
			return nil, fmt.Errorf("redis-server exited at start: %w\n%s", err, r.logTail())
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("redis-server on port %d did not answer within 10s: %w\n%s", port, err, r.logTail())
		}
	}
}

// URL is the server's Redis URL.
func (r *privateRedis) URL() string { return "redis://" + r.addr() + "/0" }

func (r *privateRedis) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// stop kills the server and waits for it to exit.
func (r *privateRedis) stop() {
	_ = r.cmd.Process.Kill()
	<-r.exited
}

func (r *privateRedis) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
