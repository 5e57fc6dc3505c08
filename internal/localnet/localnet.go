package localnet

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// FreePort returns a loopback port no socket holds now, drawn at random
// below the kernel's ephemeral range (ip_local_port_range) where there is
// room: the ports of outgoing connections, which a busy host opens by the
// thousand, come from that range, so one of them cannot take the port
// between this call and the caller's bind. Another listener still could;
// the caller's start then fails.
func FreePort() (int, error) {
	if lo := ephemeralStart(); lo-freePortFloor >= 1000 {
		for range 64 {
			port := freePortFloor + rand.IntN(lo-freePortFloor)
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
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

// freePortFloor is the lowest port FreePort draws: above the ports daemons
// are configured on by convention.
const freePortFloor = 20000

// ephemeralStart is the first port of the kernel's ephemeral range (0 when
// it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
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
