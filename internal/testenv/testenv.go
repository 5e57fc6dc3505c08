package testenv

import (
	"fmt"
	"os"
	"testing"

	"github.com/kilnrun/kiln/internal/localnet"
)

// Required reports whether integration dependencies must be present (CI).
func Required() bool { return os.Getenv("KILN_INTEGRATION") == "require" }

// Unavailable skips t, or fails it under KILN_INTEGRATION=require.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("integration dependency missing (KILN_INTEGRATION=require): %s", msg)
	}
	t.Skipf("integration dependency missing: %s (set KILN_INTEGRATION=require to fail instead)", msg)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := localnet.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
