package testenv

import (
	"net"
	"os"
	"testing"
	"time"
)

// DefaultContainerdAddress is where Kiln looks for containerd unless KILN_CONTAINERD_ADDRESS says otherwise.
const DefaultContainerdAddress = "/run/containerd/containerd.sock"

// Containerd returns the containerd socket address after checking that it
// answers and that the test runs as root (runc needs it).
func Containerd(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("KILN_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = DefaultContainerdAddress
	}
	if os.Geteuid() != 0 {
		Unavailable(t, "sandbox tests need root (runc); running as uid %d", os.Geteuid())
	}
	c, err := net.DialTimeout("unix", addr, 2*time.Second)
	if err != nil {
		Unavailable(t, "containerd not answering on %s: %v (run `make containerd`)", addr, err)
	}
	c.Close()
	return addr
}

// ContainerdNamespace is the containerd namespace integration tests use for
// images and sandboxes: KILN_CONTAINERD_NAMESPACE, default "kiln" (where
// `make image` puts the images). A separate namespace lets two checkouts on
// one host test different images side by side.
func ContainerdNamespace() string {
	if ns := os.Getenv("KILN_CONTAINERD_NAMESPACE"); ns != "" {
		return ns
	}
	return "kiln"
}
