package containerd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/containerd/containerd"
)

// LogVersion logs the daemon's version, and warns when it is a
// release line past its end of life (before 1.7).
func LogVersion(ctx context.Context, client *containerd.Client, log *slog.Logger) {
	v, err := client.Version(ctx)
	if err != nil {
		log.WarnContext(ctx, "sandbox: containerd version", slog.Any("error", err))
		return
	}
	log.InfoContext(ctx, "sandbox: containerd", slog.String("version", v.Version))
	if eol(v.Version) {
		log.WarnContext(ctx, "sandbox: this containerd release line is past its end of life; deploy/local/containerd-build.sh builds the pinned 1.7 LTS",
			slog.String("version", v.Version))
	}
}

// eol reports whether a containerd version string ("v1.6.20", "1.6.20~ds1")
// is of a release line before 1.7.
func eol(version string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 1 || (major == 1 && minor < 7)
}
