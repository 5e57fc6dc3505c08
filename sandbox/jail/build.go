package jail

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// LibraryName is the library's file name beside kiln-init.
const LibraryName = "libkilnjail.so"

// Build compiles the library from the sources beside this package into
// out with the host's gcc (csrc/build.sh, what `make init` runs): the
// sandbox suites test the library of their own checkout, as they do
// kiln-init.
func Build(ctx context.Context, out string) error {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return fmt.Errorf("jail: build: the package's sources are not known")
	}
	script := filepath.Join(filepath.Dir(self), "csrc", "build.sh")
	if b, err := exec.CommandContext(ctx, "bash", script, out).CombinedOutput(); err != nil {
		return fmt.Errorf("jail: build %s: %w\n%s", out, err, b)
	}
	return nil
}
