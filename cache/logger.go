package cache

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// RouteClientLogs sends the Redis client library's own log lines (dial
// failures, pool errors during an outage) to log at WARN, so they appear as
// structured records instead of plain text in the middle of a JSON log.
// The library keeps one logger per process, so binaries call this once at
// start-up (it is wiring, like slog.SetDefault), never libraries or tests.
func RouteClientLogs(log *slog.Logger) {
	if log == nil {
		return
	}
	redis.SetLogger(slogAdapter{log: log})
}

type slogAdapter struct{ log *slog.Logger }

func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	a.log.WarnContext(ctx, fmt.Sprintf(format, v...), slog.String("component", "redis-client"))
}
