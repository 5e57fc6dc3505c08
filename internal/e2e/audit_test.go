package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// Acceptance 4 of issue 26: the audit log lists every action of a scripted
// session in order (budget, cancel, submission and result, a budget's
// refusal, a replay and its result), with hashes and the key that acted,
// nothing of another tenant's, and the same after NATS and the API restart.
func TestAuditLogOfASession(t *testing.T) {
	e := setup(t)
	newAPI := func() *httptest.Server {
		srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
			Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond,
			APIKeys: map[string]string{"key-a": "alice", "key-b": "bob"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		hs := serveAPI(t, srv.Handler())
		t.Cleanup(hs.Close)
		t.Cleanup(srv.StopLongPolls)
		return hs
	}
	hs := newAPI()
	do := func(key, method, path string, body any) (int, map[string]any) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, hs.URL+path, rd)
		req.Header.Set("Authorization", "Bearer "+key)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	// logged waits until the worker has logged job id's result: the next
	// action of the session comes after it.
	logged := func(key, id string) {
		t.Helper()
		e.waitRecord(t, id, 90*time.Second, func(r cache.Record) bool { return r.Status.Terminal() })
		testkit.Eventually(t, 30*time.Second, "job "+id+"'s result record", func() bool {
			_, body := do(key, http.MethodGet, "/v1/audit?kind=result", nil)
			recs, _ := body["records"].([]any)
			for _, r := range recs {
				if m, _ := r.(map[string]any); m["job_id"] == id {
					return true
				}
			}
			return false
		})
	}
	start := time.Now().UTC()

	_, bud := do("key-a", http.MethodPost, "/v1/budgets", map[string]any{"max_runs": 1})
	budget := bud["id"].(string)
	e.startWorker(t, "w-audit", 1)
	_, long := do("key-a", http.MethodPost, "/v1/jobs", map[string]any{"code": "import time\ntime.sleep(60)\n", "cache": false})
	canceled := long["id"].(string)
	e.waitRecord(t, canceled, 60*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	if status, body := do("key-a", http.MethodDelete, "/v1/jobs/"+canceled, nil); status != http.StatusAccepted && status != http.StatusOK {
		t.Fatalf("cancel: %d %v", status, body)
	}
	logged("key-a", canceled)
	_, ran := do("key-a", http.MethodPost, "/v1/jobs", map[string]any{"code": "print(6 * 7)", "stdin": "x", "cache": false, "budget": budget})
	first := ran["id"].(string)
	logged("key-a", first)
	if status, _ := do("key-a", http.MethodPost, "/v1/jobs", map[string]any{"code": "print(1)", "cache": false, "budget": budget}); status != http.StatusConflict {
		t.Fatalf("second run of a 1-run budget: %d", status)
	}
	_, rep := do("key-a", http.MethodPost, "/v1/jobs/"+first+"/replay", nil)
	replay := rep["id"].(string)
	logged("key-a", replay)
	_, theirs := do("key-b", http.MethodPost, "/v1/jobs", map[string]any{"code": "print('bob')", "cache": false})
	logged("key-b", theirs["id"].(string))

	type rec struct {
		Seq        uint64            `json:"seq"`
		Kind       string            `json:"kind"`
		Key        string            `json:"key"`
		JobID      string            `json:"job_id"`
		Digest     string            `json:"digest"`
		CodeSHA256 string            `json:"code_sha256"`
		Inputs     map[string]string `json:"inputs"`
		Status     string            `json:"status"`
		Outputs    map[string]string `json:"outputs"`
		Budget     string            `json:"budget"`
	}
	read := func(key, query string) []rec {
		t.Helper()
		status, body := do(key, http.MethodGet, "/v1/audit"+query, nil)
		if status != http.StatusOK {
			t.Fatalf("audit: %d %v", status, body)
		}
		b, _ := json.Marshal(body["records"])
		var out []rec
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	summary := func(rs []rec) []string {
		var s []string
		for _, r := range rs {
			s = append(s, fmt.Sprintf("%s %s", r.Kind, r.JobID))
		}
		return s
	}
	want := []string{"budget_created ", "submission " + canceled, "cancel " + canceled, "result " + canceled, "submission " + first,
		"result " + first, "budget_refusal ", "replay " + replay, "result " + replay}
	check := func(when string) {
		t.Helper()
		got := read("key-a", "?since="+start.Format(time.RFC3339Nano))
		if !slices.Equal(summary(got), want) {
			t.Fatalf("%s: alice's log\n%v\nwant\n%v", when, summary(got), want)
		}
		for i, r := range got {
			if i > 0 && r.Seq <= got[i-1].Seq {
				t.Fatalf("%s: records out of order: %+v", when, got)
			}
			if r.Kind != "result" && r.Key == "" {
				t.Fatalf("%s: %s record names no key", when, r.Kind)
			}
		}
		sub, res := got[4], got[5]
		if sub.CodeSHA256 != job.CodeSHA256("print(6 * 7)") || sub.Inputs["stdin"] == "" || sub.Digest == "" || sub.Budget != budget {
			t.Fatalf("%s: submission %+v", when, sub)
		}
		if res.Status != "succeeded" || len(res.Outputs["stdout"]) != 64 || res.Digest != sub.Digest {
			t.Fatalf("%s: result %+v", when, res)
		}
		if rs := read("key-a", "?kind=result"); len(rs) != 3 {
			t.Fatalf("%s: kind=result gave %v", when, summary(rs))
		}
		bob := read("key-b", "")
		if len(bob) != 2 || bob[0].Kind != "submission" || bob[1].Kind != "result" || bob[0].Key == got[0].Key {
			t.Fatalf("%s: bob's log %v", when, summary(bob))
		}
	}
	check("live")

	// The log is in JetStream's file store: it outlives NATS and the API.
	e.nats.Restart()
	hs = newAPI()
	testkit.Eventually(t, 30*time.Second, "the NATS connection to reconnect", func() bool { return e.nc.IsConnected() })
	check("after restarts")

	if status, _ := do("key-a", http.MethodGet, "/v1/audit?kind=nope", nil); status != http.StatusBadRequest {
		t.Fatalf("unknown kind: %d", status)
	}
}
