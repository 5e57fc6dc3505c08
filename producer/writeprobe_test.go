package producer

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
)

// A JetStream store that stops taking writes fails /readyz, naming it, and
// /readyz recovers once writes succeed again. The store is made to refuse
// writes the way a full one does: the probe stream's byte limit is set
// below one message, so every write is refused by the server.
func TestReadyzFailsWhileTheStoreRefusesWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.StoreProbeInterval = 20 * time.Millisecond })
	ctx := context.Background()
	readyz := func() (int, string) {
		r := b.do(t, http.MethodGet, "/readyz", "")
		return r.StatusCode, string(r.body)
	}
	await := func(want int, contains string) string {
		t.Helper()
		var code int
		var body string
		if !testkit.Poll(5*time.Second, func() bool {
			code, body = readyz()
			return code == want && strings.Contains(body, contains)
		}) {
			t.Fatalf("/readyz %d %s; want %d with %q", code, body, want, contains)
		}
		return body
	}
	if code, body := readyz(); code != http.StatusOK || !strings.Contains(body, `"jetstream_store":"ok"`) {
		t.Fatalf("/readyz right after New: %d %s", code, body)
	}
	st, err := b.js.Stream(ctx, queue.ProbeStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	full := cfg
	full.MaxBytes, full.Discard = 1, jetstream.DiscardNew
	if _, err := b.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	body := await(http.StatusServiceUnavailable, `"jetstream_store":"unavailable`)
	t.Logf("store refusing writes: %s", body)
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	await(http.StatusOK, `"jetstream_store":"ok"`)
}
