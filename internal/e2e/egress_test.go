package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/egresstest"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/worker"
	"github.com/kilnrun/kiln/worker/egress"
)

// Issue 25 through the API: a tenant allowed files.test and plain.test
// fetches from the test servers by name; a name the job did not ask for is
// refused; every connection is in the job's result, on its trace and in
// its tenant's audit log (and not in another tenant's); a tenant without
// an egress allowance is refused at submission, naming the host.
func TestEgressThroughTheAPI(t *testing.T) {
	tp, exp := memTracing()
	e := setup(t, withTracerProvider(tp))
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
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, TracerProvider: tp,
		APIKeys: map[string]string{"key-a": "alice", "key-b": "bob"},
		Tenants: map[string]producer.Tenant{"alice": {Egress: allowance}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := serveAPI(t, api.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(api.StopLongPolls)
	t.Cleanup(api.Close)
	e.startWorker(t, "e2e-egress", 1, withImages(map[string]string{"python": pythonImage(t)}),
		func(c *telemetry) { c.worker = func(w *worker.Config) { w.EgressTestHosts = th } })

	do := (&sessAPI{t: t, base: hs.URL}).do
	code := `
import urllib.request
for u in ("https://files.test/hello", "http://plain.test/hello"):
    try:
        print("ok", urllib.request.urlopen(u, timeout=20).read().decode())
    except Exception as e:
        print("refused", u, e)
`
	spec := map[string]any{"code": code, "network": map[string]any{"allow": []string{"files.test"}},
		"files": []job.File{{Name: "ca.pem", Content: string(srv.CAPEM)}}, "env": map[string]string{"SSL_CERT_FILE": "/work/ca.pem"}}

	status, body := do("key-b", "POST", "/v1/jobs", spec)
	if status != http.StatusUnprocessableEntity || !strings.Contains(string(body), "egress-not-allowed") || !strings.Contains(string(body), "files.test") {
		t.Fatalf("bob (no allowance): %d %s", status, body)
	}

	status, body = do("key-a", "POST", "/v1/jobs?wait=60s", spec)
	if status != http.StatusOK {
		t.Fatalf("alice: %d %s", status, body)
	}
	var res job.Result
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != job.StatusSucceeded || !strings.HasPrefix(res.Stdout, "ok hello from files.test\nrefused http://plain.test/hello") {
		t.Fatalf("result: %s %+v\n%s\n%s", res.Status, res.Error, res.Stdout, res.Stderr)
	}
	if eg := res.Egress; eg == nil || eg.Connections != 2 || eg.Refused != 1 || len(eg.Records) != 2 {
		t.Fatalf("the result's egress: %+v", res.Egress)
	}

	// The trace: one event per connection on the job's spans.
	var events []string
	testkit.Eventually(t, 10*time.Second, "the job's egress events on its trace", func() bool {
		events = events[:0]
		for _, spans := range spansOf(exp, res.TraceID) {
			for _, s := range spans {
				for _, ev := range s.Events {
					if ev.Name == "kiln.egress.connection" {
						var host string
						var allowed bool
						for _, a := range ev.Attributes {
							switch a.Key {
							case "kiln.egress.host":
								host = a.Value.AsString()
							case "kiln.egress.allowed":
								allowed = a.Value.AsBool()
							}
						}
						events = append(events, host+map[bool]string{true: " allowed", false: " refused"}[allowed])
					}
				}
			}
		}
		return len(events) == 2
	})
	// Recorded as each connection ends: an HTTPS tunnel can outlive the
	// refused plain request made after it.
	slices.Sort(events)
	if strings.Join(events, ",") != "files.test allowed,plain.test refused" {
		t.Fatalf("egress events on the trace: %v", events)
	}

	// The tenant's log lists both; the other tenant's lists none.
	type page struct {
		Records []job.AuditRecord `json:"records"`
	}
	var alice page
	testkit.Eventually(t, 10*time.Second, "alice's egress records", func() bool {
		status, body := do("key-a", "GET", "/v1/audit?kind=egress", nil)
		alice = page{}
		return status == 200 && json.Unmarshal(body, &alice) == nil && len(alice.Records) == 2
	})
	for _, r := range alice.Records {
		if r.JobID != res.ID || r.Egress == nil || (r.Egress.Host == "files.test") != r.Egress.Allowed {
			t.Fatalf("alice's egress record %+v %+v", r, r.Egress)
		}
	}
	status, body = do("key-b", "GET", "/v1/audit?kind=egress", nil)
	var bob page
	if status != 200 || json.Unmarshal(body, &bob) != nil || len(bob.Records) != 0 {
		t.Fatalf("bob's egress log: %d %s", status, body)
	}

	// A session of alice's with the same allowlist: each call's result
	// carries its own connections; bob's is refused at creation.
	sess := map[string]any{"network": map[string]any{"allow": []string{"files.test"}},
		"files": []job.File{{Name: "ca.pem", Content: string(srv.CAPEM)}}}
	if status, body := do("key-b", "POST", "/v1/sessions", sess); status != http.StatusUnprocessableEntity || !strings.Contains(string(body), "egress-not-allowed") {
		t.Fatalf("bob's session with a network: %d %s", status, body)
	}
	status, body = do("key-a", "POST", "/v1/sessions", sess)
	var s job.Session
	if status != http.StatusCreated || json.Unmarshal(body, &s) != nil || s.Network == nil || len(s.Network.Allow) != 1 {
		t.Fatalf("alice's session: %d %s", status, body)
	}
	t.Cleanup(func() { do("key-a", "DELETE", "/v1/sessions/"+s.ID, nil) })
	for range 2 {
		status, body = do("key-a", "POST", "/v1/sessions/"+s.ID+"/exec?wait=60s",
			map[string]any{"code": code, "env": map[string]string{"SSL_CERT_FILE": "/work/ca.pem"}})
		var cr struct {
			job.Result
			Seq int64 `json:"seq"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &cr) != nil {
			t.Fatalf("session call: %d %s", status, body)
		}
		if cr.Status != job.StatusSucceeded || !strings.HasPrefix(cr.Stdout, "ok hello from files.test\nrefused http://plain.test/hello") {
			t.Fatalf("session call %d: %s %+v\n%s\n%s", cr.Seq, cr.Status, cr.Error, cr.Stdout, cr.Stderr)
		}
		if eg := cr.Egress; eg == nil || eg.Connections != 2 || eg.Refused != 1 {
			t.Fatalf("session call %d's egress: %+v", cr.Seq, cr.Egress)
		}
	}
}
