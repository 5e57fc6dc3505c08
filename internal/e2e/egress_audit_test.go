package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/egresstest"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/worker"
	"github.com/kilnrun/kiln/worker/egress"
)

// hammerSeconds is how long the job hammers its proxy (the acceptance's
// 60 s).
const hammerSeconds = 60

// Issue 40, acceptance 2 (first half): a real job hammering its egress
// proxy for 60 s (two allowed fetches, then refused connections as fast as
// it can make them, far past its 64-connection cap) adds a handful of
// audit records: its two connections, its refusals folded into one, those
// past the cap into one more, its result; the audit stream grows by a few
// KiB, not by megabytes.
func TestEgressHammerAddsAHandfulOfAuditRecords(t *testing.T) {
	e := setup(t)
	srv := egresstest.New(t, "files.test")
	th, err := egress.ParseTestHosts(srv.Hosts("files.test", "plain.test"))
	if err != nil {
		t.Fatal(err)
	}
	allowance, err := egressrule.ParseRules("files.test,plain.test")
	if err != nil {
		t.Fatal(err)
	}
	api, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond,
		APIKeys: map[string]string{"key-h": "hammer"}, Tenants: map[string]producer.Tenant{"hammer": {Egress: allowance}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(api.StopLongPolls)
	t.Cleanup(api.Close)
	e.startWorker(t, "e2e-hammer", 1, func(c *telemetry) { c.worker = func(w *worker.Config) { w.EgressTestHosts = th } })
	do := (&sessAPI{t: t, base: hs.URL}).do
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	streamBytes := func() uint64 {
		s, err := js.Stream(context.Background(), job.AuditStreamName)
		if err != nil {
			return 0
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}
	code := `import time, urllib.request
for u in ("https://files.test/hello", "https://files.test/hello"):
    print(urllib.request.urlopen(u, timeout=20).read().decode())
n, end = 0, time.time() + ` + itoa(hammerSeconds) + `
while time.time() < end:
    try:
        urllib.request.urlopen("http://plain.test/hello", timeout=5)
    except Exception:
        pass
    n += 1
print("refused", n)
`
	spec := map[string]any{"code": code, "network": map[string]any{"allow": []string{"files.test"}},
		"limits": map[string]any{"timeout_ms": (hammerSeconds + 30) * 1000, "cpu_ms": (hammerSeconds + 30) * 1000},
		"files":  []job.File{{Name: "ca.pem", Content: string(srv.CAPEM)}}, "env": map[string]string{"SSL_CERT_FILE": "/work/ca.pem"}}
	before := streamBytes()
	status, body := do("key-h", "POST", "/v1/jobs", spec)
	var res job.Result
	if status != http.StatusAccepted || json.Unmarshal(body, &res) != nil {
		t.Fatalf("the job: %d %s", status, body)
	}
	for id := res.ID; !res.Status.Terminal(); { // long-polls of at most a minute each
		if status, body = do("key-h", "GET", "/v1/jobs/"+id+"?wait=60s", nil); status != http.StatusOK || json.Unmarshal(body, &res) != nil {
			t.Fatalf("the job: %d %s", status, body)
		}
	}
	if res.Status != job.StatusSucceeded || res.Egress == nil || res.Egress.Connections < 1000 {
		t.Fatalf("result: %s %+v, %d connections\n%s", res.Status, res.Error, res.Egress.Connections, res.Stderr)
	}
	var page struct {
		Records []job.AuditRecord `json:"records"`
	}
	status, body = do("key-h", "GET", "/v1/audit", nil)
	if status != http.StatusOK || json.Unmarshal(body, &page) != nil {
		t.Fatalf("the audit log: %d %s", status, body)
	}
	var kinds []string
	var counted int64
	for _, r := range page.Records {
		if r.JobID != res.ID {
			continue
		}
		kinds = append(kinds, string(r.Kind))
		if r.Kind == job.AuditEgress {
			counted += max(r.Count, 1)
		}
	}
	grew := streamBytes() - before
	t.Logf("%d connections in %d s (%d refused): the job's audit records %v (%d connections counted), the stream grew by %d bytes",
		res.Egress.Connections, hammerSeconds, res.Egress.Refused, kinds, counted, grew)
	if len(kinds) > 6 || counted != int64(res.Egress.Connections) {
		t.Errorf("%d audit records for the job (%v) counting %d connections; want a handful counting all %d", len(kinds), kinds, counted, res.Egress.Connections)
	}
	if !strings.Contains(strings.Join(kinds, ","), "submission") || !strings.Contains(strings.Join(kinds, ","), "result") {
		t.Errorf("the job's records %v lack its submission or result", kinds)
	}
	if grew > 64<<10 {
		t.Errorf("the audit stream grew by %d bytes during the job", grew)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
