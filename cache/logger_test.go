package cache

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
)

// The client library's own complaints during an outage come out as JSON
// records of our logger, not as plain "redis: ..." lines.
func TestClientLogsGoThroughSlog(t *testing.T) {
	var buf testkit.SyncBuffer
	RouteClientLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	r := testenv.StartRedis(t)
	s, err := New(context.Background(), Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.Ping(ctx)
	out := buf.String()
	if out == "" {
		t.Fatal("the client logged nothing while Redis was down")
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON record: %q", line)
		}
		if rec["component"] != "redis-client" || rec["level"] != "WARN" {
			t.Fatalf("record %v", rec)
		}
	}
}
