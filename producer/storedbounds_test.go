package producer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// The API warns at start when its tenants' stored-bytes bounds add up to
// more than the object store holds.
func TestWarnStoredBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tenants int
		bound   int64
		warn    bool
	}{{2, 0, false}, {11, 0, true}, {11, 1 << 20, false}} {
		var buf bytes.Buffer
		cfg := Config{APIKeys: map[string]string{}, Tenants: map[string]Tenant{}}
		for i := range tc.tenants {
			name := fmt.Sprintf("t%d", i)
			cfg.APIKeys["k-"+name] = name
			cfg.Tenants[name] = Tenant{Bounds: Bounds{StoredBytes: tc.bound}}
		}
		warnStoredBounds(context.Background(), slog.New(slog.NewTextHandler(&buf, nil)), cfg)
		if got := strings.Contains(buf.String(), "max_stored_bytes add up"); got != tc.warn {
			t.Errorf("%d tenants of %d bytes: warned %v, want %v (%s)", tc.tenants, tc.bound, got, tc.warn, buf.String())
		}
	}
}
