package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// nodeImage runs these tests on the node runtime: its recipe changes less
// often than python's, so the image the machine holds is more likely this
// checkout's.
var nodeImage = withImages(map[string]string{"node": "kiln.local/node:latest"})

// node is a node job of code.
func node(code string) job.Spec {
	return job.Spec{Runtime: "node", Code: code, Cache: job.CacheOff()}
}

// tenantsAPI serves an API over e's stores with these tenants, and returns
// a client per key.
func (e *env) tenantsAPI(t *testing.T, ctx context.Context, keys map[string]string, tenants map[string]producer.Tenant) map[string]*client.Client {
	t.Helper()
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue, APIKeys: keys, Tenants: tenants,
		RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	out := map[string]*client.Client{}
	for k := range keys {
		out[k], _ = client.New(hs.URL, client.WithAPIKey(k))
	}
	return out
}

// Issue 23, acceptance 5, on the real pipeline: a tenant with 3
// CPU-seconds a day submits a batch of five jobs that each burn 1.2 s of
// CPU (cpu_ms 1500, so each reserves 2 s as it starts; the limit holds all
// the container's processes together, node's start-up included). Runs start only
// while what is left of the quota covers them: at most 3 s plus one job's
// overrun is used, and the others end at once as quota_exceeded, never run.
func TestCPUQuotaHoldsAcrossABatch(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := e.tenantsAPI(t, ctx, map[string]string{"k-frugal": "frugal"},
		map[string]producer.Tenant{"frugal": {Quota: producer.Quota{CPUSecondsPerDay: 3}}})["k-frugal"]
	e.startWorker(t, "e2e-cpu-quota", 2, nodeImage)
	specs := make([]job.Spec, 5)
	for i := range specs {
		specs[i] = node("const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6 };\n" +
			"const t = cpu(); while (cpu() - t < 1.2) {}\nconsole.log('done')")
		specs[i].Limits.CPUMS = 1500
		specs[i].Limits.TimeoutMS = 20_000
	}
	items, err := c.Batch(ctx, specs)
	if err != nil {
		t.Fatal(err)
	}
	var used time.Duration
	ran, refused := 0, 0
	for _, it := range items {
		if it.Err != nil {
			t.Fatalf("job %d refused at submission: %v", it.Index, it.Err)
		}
		v, err := c.Wait(ctx, it.Submission.ID)
		if err != nil {
			t.Fatal(err)
		}
		r := v.Result
		switch {
		case r.Status == job.StatusFailed && r.Error != nil && r.Error.Category == job.CategoryQuota:
			refused++
			if r.Error.Retryable || !strings.Contains(r.Error.Message, string(job.QuotaCPUDay)) || r.CPUMS != 0 || e.runs.of(it.Submission.ID) != 0 {
				t.Errorf("refused job %d: %+v, cpu %d ms, runs %d; want not run, naming the quota", it.Index, r.Error, r.CPUMS, e.runs.of(it.Submission.ID))
			}
		case r.Status == job.StatusSucceeded:
			ran++
			used += time.Duration(r.CPUMS) * time.Millisecond
		default:
			t.Errorf("job %d: %s %+v", it.Index, r.Status, r.Error)
		}
	}
	t.Logf("%d of 5 jobs ran using %v of CPU against a 3 s quota; %d refused", ran, used, refused)
	if used > 3*time.Second+1500*time.Millisecond || ran+refused != 5 || refused == 0 {
		t.Fatalf("%d jobs ran using %v, %d refused: want at most 3 s plus one job's overrun", ran, used, refused)
	}
}

// Issue 23, acceptance 2, on the real pipeline with a small bound: a tenant
// over its stored-bytes bound gets its own clear failure, once; another
// tenant's job with an artifact and big output in the same minute succeeds
// with everything stored.
func TestStoredBoundIsPerTenant(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := e.tenantsAPI(t, ctx, map[string]string{"k-hog": "hog", "k-calm": "calm"},
		map[string]producer.Tenant{"hog": {Bounds: producer.Bounds{StoredBytes: 300 << 10}}})
	e.startWorker(t, "e2e-stored", 2, nodeImage)
	run := func(c *client.Client, code string) (string, job.Result) {
		t.Helper()
		sub, err := c.Submit(ctx, node(code))
		if err != nil {
			t.Fatal(err)
		}
		v, err := c.Wait(ctx, sub.ID)
		if err != nil {
			t.Fatal(err)
		}
		return sub.ID, v.Result
	}
	const artifact = "require('fs').writeFileSync(process.env.KILN_OUTPUT_DIR + '/a.bin', require('crypto').randomBytes(%d));\n"
	const output = "console.log('x'.repeat(%d));\n"
	if _, r := run(cs["k-hog"], strings.Replace(artifact, "%d", "250_000", 1)); r.Status != job.StatusSucceeded || len(r.Artifacts) != 1 {
		t.Fatalf("the hog's first job: %s %+v %+v", r.Status, r.Error, r.ArtifactsSkipped)
	}
	id, r := run(cs["k-hog"], strings.Replace(output, "%d", "200_000", 1))
	if r.Status != job.StatusFailed || r.Error == nil || r.Error.Category != job.CategoryOutputLimit || r.Error.Retryable ||
		!strings.Contains(r.Error.Message, string(job.QuotaStoredBytes)) || r.Attempt != 1 || e.runs.of(id) != 1 {
		t.Fatalf("the hog's job over its bound: %s %+v, attempt %d, runs %d", r.Status, r.Error, r.Attempt, e.runs.of(id))
	}
	if !r.StdoutTruncated || r.StdoutBytes != 200_001 {
		t.Errorf("the refused output: truncated %v, %d bytes", r.StdoutTruncated, r.StdoutBytes)
	}
	t.Logf("the hog: %s", r.Error.Message)
	_, r = run(cs["k-calm"], strings.Replace(artifact, "%d", "250_000", 1)+strings.Replace(output, "%d", "200_000", 1))
	if r.Status != job.StatusSucceeded || len(r.Artifacts) != 1 || r.StdoutTruncated || r.StdoutBytes != 200_001 {
		t.Fatalf("the other tenant's job: %s %+v, artifacts %+v skipped %+v, stdout truncated %v", r.Status, r.Error, r.Artifacts, r.ArtifactsSkipped, r.StdoutTruncated)
	}
}
