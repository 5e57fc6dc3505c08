package initproto

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kilnrun/kiln/internal/testenv"
)

// The launchers' own tests (deploy/images/tests) read the same vectors as
// vectors_test.go: the Python launchers' (the frame, a box's header and
// parameters, the zygote's reports, and that the launcher and the zygote
// refuse another major version) and the Node launcher's (the frame, and
// the refusal).
var launcherTests = filepath.Join("..", "..", "deploy", "images", "tests")

func TestPythonLauncherReadsTheVectors(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.Unavailable(t, "python3 runs the Python launchers' tests: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), py, "-B", "-m", "unittest", "discover", "-v", "-s", launcherTests, "-p", "test_*.py")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the Python launchers' tests: %v", err)
	}
}

func TestNodeLauncherReadsTheVectors(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Unavailable(t, "node runs the Node launcher's tests: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), node, "--test", launcherTests+string(filepath.Separator)).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the Node launcher's tests: %v", err)
	}
}
