package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// Acceptance 3 of issue 26: a replay runs on the same digest; it is
// identical for deterministic code (artifact included) and says which
// fields differ for random output; another tenant's replay is 404.
func TestReplayByID(t *testing.T) {
	e := setup(t)
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
	e.startWorker(t, "w-replay", 2)

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
	finished := func(id string) *job.Result {
		t.Helper()
		rec := e.waitRecord(t, id, 90*time.Second, func(r cache.Record) bool { return r.Status.Terminal() })
		if rec.Status != job.StatusSucceeded {
			t.Fatalf("job %s: %s %+v %s", id, rec.Status, rec.Result.Error, rec.Result.Stderr)
		}
		return rec.Result
	}
	replay := func(id string) *job.Result {
		t.Helper()
		status, body := do("key-a", http.MethodPost, "/v1/jobs/"+id+"/replay", nil)
		if status != http.StatusAccepted {
			t.Fatalf("replay %s: %d %v", id, status, body)
		}
		return finished(body["id"].(string))
	}

	code := `import os
print(sum(range(10)))
open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "out.txt"), "w").write("fixed")
`
	_, body := do("key-a", http.MethodPost, "/v1/jobs", map[string]any{"code": code, "stdin": "in", "limits": map[string]any{"timeout_ms": 8000}})
	det := body["id"].(string)
	orig := finished(det)
	r := replay(det)
	if r.ReplayOf != det || r.Replay == nil || !r.Replay.Identical || r.Image.Digest != orig.Image.Digest || r.CacheHit ||
		r.Limits == nil || r.Limits.TimeoutMS != 8000 || len(r.Artifacts) != 1 {
		t.Fatalf("replay of deterministic job: replay_of %q replay %+v digest %s (orig %s) cache_hit %v limits %+v artifacts %v",
			r.ReplayOf, r.Replay, r.Image.Digest, orig.Image.Digest, r.CacheHit, r.Limits, r.Artifacts)
	}

	_, body = do("key-a", http.MethodPost, "/v1/jobs", map[string]any{"code": "import random\nprint(random.random())\n"})
	rnd := body["id"].(string)
	finished(rnd)
	r = replay(rnd)
	if r.ReplayOf != rnd || r.Replay == nil || r.Replay.Identical || !slices.Equal(r.Replay.Differs, []string{"stdout"}) {
		t.Fatalf("replay of random job: %+v", r.Replay)
	}

	if status, body := do("key-b", http.MethodPost, "/v1/jobs/"+det+"/replay", nil); status != http.StatusNotFound || body["type"] != string(job.ProblemNotFound) {
		t.Fatalf("bob replays alice's job: %d %v", status, body)
	}
}
