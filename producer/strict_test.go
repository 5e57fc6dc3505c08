package producer

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

func TestFieldNamesMatchExactlyAndOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		body, typ, field string
	}{
		{`{"code":"print(1)","CODE":"print(2)"}`, string(job.ProblemFieldNameCase), "CODE"},
		{`{"Code":"print(2)"}`, string(job.ProblemFieldNameCase), "Code"},
		{`{"code":"print(1)","code":"print(2)"}`, string(job.ProblemDuplicateField), "code"},
		{`{"code":"x","cache":false,"CACHE":true}`, string(job.ProblemFieldNameCase), "CACHE"},
		{`{"code":"x","cache":false,"cache":true}`, string(job.ProblemDuplicateField), "cache"},
		{`{"code":"x","cache":{"MAX_AGE_S":5}}`, string(job.ProblemFieldNameCase), "cache.MAX_AGE_S"},
		{`{"code":"x","limits":{"Memory_MB":64}}`, string(job.ProblemFieldNameCase), "limits.Memory_MB"},
		{`{"code":"x","limits":{"memory_mb":64,"memory_mb":1024}}`, string(job.ProblemDuplicateField), "limits.memory_mb"},
		{`{"code":"x","files":[{"name":"a","NAME":"b","content":""}]}`, string(job.ProblemFieldNameCase), "files[0].NAME"},
		{`{"code":"x","env":{"A":"1","A":"2"}}`, string(job.ProblemDuplicateField), "env.A"},
	} {
		r := b.submit(t, tc.body)
		p := r.problem(t, http.StatusBadRequest)
		if p.Type != tc.typ || p.Field != tc.field || !strings.Contains(p.Detail, tc.field) {
			t.Fatalf("%s: %s; want type %s naming field %s", tc.body, r.body, tc.typ, tc.field)
		}
	}
	// Env names are the program's: "A" and "a" are two variables.
	accepted(t, b.submit(t, `{"code":"x","env":{"A":"1","a":"2"}}`))
	// In a batch, a bad job fails alone.
	r := b.do(t, http.MethodPost, "/v1/jobs/batch", `{"jobs":[{"code":"print(1)","CODE":"print(2)"},{"code":"print(3)"}]}`)
	var out struct {
		Jobs []batchItem `json:"jobs"`
	}
	r.decode(t, &out)
	if r.StatusCode != 200 || len(out.Jobs) != 2 || out.Jobs[0].Error == nil || out.Jobs[0].Error.Field != "jobs[0].CODE" || out.Jobs[1].Status != 202 {
		t.Fatalf("batch: %d %s", r.StatusCode, r.body)
	}
	b.do(t, http.MethodPost, "/v1/jobs/batch", `{"jobs":[],"JOBS":[]}`).problem(t, http.StatusBadRequest)
}

func TestListCollapsesRepeatedIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	v1 := accepted(t, b.submit(t, `{"code":"print(1)"}`))
	v2 := accepted(t, b.submit(t, `{"code":"print(2)"}`))
	calls := func() int {
		info, err := b.rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_hgetall:calls="); ok {
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				return n
			}
		}
		return 0
	}
	before := calls()
	ids := strings.Repeat(v1.ID+",", 50) + strings.Repeat(v2.ID+",", 49) + v1.ID
	r := b.do(t, http.MethodGet, "/v1/jobs?ids="+ids, "")
	var out struct {
		Jobs []pendingView `json:"jobs"`
	}
	r.decode(t, &out)
	if r.StatusCode != 200 || len(out.Jobs) != 2 || out.Jobs[0].ID != v1.ID || out.Jobs[1].ID != v2.ID {
		t.Fatalf("list of 100 ids, 2 distinct: %d %s", r.StatusCode, r.body)
	}
	if got := calls() - before; got != 2 {
		t.Fatalf("%d record reads for 2 distinct ids", got)
	}
}

// TestParallelBodiesAtTheLimitKeepHeapBounded sends 8 bodies of
// MaxBodyBytes at once. The body budget lets 2 be held at a time (the
// others wait), so the API's heap grows by at most
// heapPerBudgetByte × MaxBodyBytesInFlight, as docs/tenants.md states.
func TestParallelBodiesAtTheLimitKeepHeapBounded(t *testing.T) {
	// Not parallel: it measures the process's heap.
	const limit = 4 << 20
	const heapPerBudgetByte = 4
	b := setup(t, func(c *Config) {
		c.MaxBodyBytes, c.MaxBodyBytesInFlight, c.BodyWait = limit, 2*limit, 30*time.Second
	})
	// A spec that decodes in full and is refused after (unknown runtime), so
	// the measure is the API's hold on bodies, not Redis or NATS.
	head, tail := `{"runtime":"nope","code":"print(1)","stdin":"`, `"}`
	bodies := make([]string, 8)
	for i := range bodies {
		bodies[i] = head + strings.Repeat(strconv.Itoa(i), limit-len(head)-len(tail)) + tail
	}
	// The heap the API holds is the live heap each GC marks, not HeapAlloc:
	// on a loaded host the collector lags and HeapAlloc counts the garbage
	// of bodies already answered. A low GC target makes cycles frequent, so
	// the live heap is marked while bodies are held.
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	base := live[0].Value.Uint64()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	codes := make([]int, len(bodies))
	for i, body := range bodies {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, b.http.URL+"/v1/jobs", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	growth := int64(peak.Load()) - int64(base)
	t.Logf("8 parallel %d MiB bodies: heap grew by %.1f MiB (budget %d MiB in flight)", limit>>20, float64(growth)/(1<<20), 2*limit>>20)
	for i, c := range codes {
		if c != http.StatusUnprocessableEntity {
			t.Fatalf("body %d answered %d, want 422 (unknown runtime)", i, c)
		}
	}
	if bound := int64(heapPerBudgetByte * 2 * limit); growth > bound {
		t.Fatalf("heap grew by %d bytes; the bound is %d", growth, bound)
	}
	_ = job.MaxSpecJSONSize
}

func TestListResponseIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxListBytes = 100 << 10 })
	ctx := context.Background()
	big := strings.Repeat("x", 60<<10)
	var ids []string
	for i := range 3 {
		ids = append(ids, accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)","cache":false}`)).ID)
		if _, err := b.worker(t, ctx, succeeded(big)); err != nil {
			t.Fatal(err)
		}
	}
	r := b.do(t, http.MethodGet, "/v1/jobs?ids="+strings.Join(ids, ","), "")
	var out struct {
		Jobs []struct {
			ID     string       `json:"id"`
			Stdout string       `json:"stdout"`
			Error  *problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &out)
	if r.StatusCode != 200 || len(out.Jobs) != 3 {
		t.Fatalf("%d, %d jobs", r.StatusCode, len(out.Jobs))
	}
	if out.Jobs[0].Stdout != big || out.Jobs[1].Stdout != big {
		t.Fatal("the first jobs, within the bound, must be complete")
	}
	if e := out.Jobs[2].Error; out.Jobs[2].ID != ids[2] || e == nil || e.Type != string(job.ProblemResponseTooLarge) || e.Limit != 100<<10 {
		t.Fatalf("third job past the 100 KiB bound: %+v", out.Jobs[2])
	}
	if len(r.body) > 200<<10 {
		t.Fatalf("answer of %d bytes", len(r.body))
	}
}
