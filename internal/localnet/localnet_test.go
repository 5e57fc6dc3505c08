package localnet

import (
	"fmt"
	"net"
	"testing"
)

// A free port is one the caller can listen on, and it is drawn below the
// kernel's ephemeral range, where outgoing connections never take it.
func TestFreePortIsBindableAndOutsideTheEphemeralRange(t *testing.T) {
	lo := ephemeralStart()
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if lo-freePortFloor >= 1000 && (port < freePortFloor || port >= lo) {
			t.Fatalf("port %d; want one in [%d, %d)", port, freePortFloor, lo)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("listen on the free port %d: %v", port, err)
		}
		l.Close()
	}
}
