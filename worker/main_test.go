package worker

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kilnrun/kiln/internal/testkit"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.NATSObjectPutLeak)
}
