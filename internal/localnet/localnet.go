package localnet

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"
)

// FreePort asks the kernel for a free loopback port. Another process could
// take it before the caller binds it; the caller's start then fails.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("find a free port: unexpected address %v", l.Addr())
	}
	return addr.Port, nil
}

// RedisPing sends one inline PING to addr and wants +PONG. It is raw on
// purpose: go-redis would log every refused dial while a server starts.
func RedisPing(ctx context.Context, addr string) error {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
