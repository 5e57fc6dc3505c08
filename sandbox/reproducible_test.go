package sandbox

import (
	"cmp"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/kilnrun/kiln/internal/testenv"
)

// TestImageReproducible builds the python-slim recipe from scratch in a
// cache of its own and requires the digest of the build `make image` made
// (same recipe hash, other time, other cache): nothing of the build host or
// the build time may reach the image (deploy/images/reproducible.sh).
func TestImageReproducible(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "image builds need root (mmdebstrap root mode); running as uid %d", os.Geteuid())
	}
	for _, bin := range []string{"mmdebstrap", "umoci", "jq"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Unavailable(t, "%s not found (run `make deps`)", bin)
		}
	}
	cache := cmp.Or(os.Getenv("KILN_IMAGE_CACHE"), "/var/cache/kiln/images")
	cmd := exec.CommandContext(t.Context(), "bash", "../deploy/images/reproducible.sh", "python-slim", cache)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("reproducible.sh: %v", err)
	}
	if !regexp.MustCompile(`first build sha256:[0-9a-f]{64}, second build sha256:[0-9a-f]{64}`).Match(out) {
		t.Fatalf("reproducible.sh printed no digests")
	}
}
