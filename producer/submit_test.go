package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

func TestSubmitQueuesJobWithMsgIDAndTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.submit(t, `{"code":"print(1)","limits":{"memory_mb":128}}`)
	v := accepted(t, r)
	if v.Status != job.StatusQueued || v.Links == nil || v.Links.Self != "/v1/jobs/"+v.ID || v.CreatedAt == nil {
		t.Fatalf("answer: %s", r.body)
	}
	if loc := r.Header.Get("Location"); loc != "/v1/jobs/"+v.ID {
		t.Fatalf("Location %q", loc)
	}
	if len(v.TraceID) != 32 {
		t.Fatalf("trace_id %q", v.TraceID)
	}

	s, err := b.js.Stream(context.Background(), job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), job.TenantJobSubject("python", job.DefaultTenant))
	if err != nil {
		t.Fatalf("no message on %s: %v", job.TenantJobSubject("python", job.DefaultTenant), err)
	}
	if got := m.Header.Get(job.HeaderMsgID); got != v.ID {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, v.ID)
	}
	tp := m.Header.Get("traceparent")
	if !strings.Contains(tp, v.TraceID) {
		t.Fatalf("traceparent %q does not carry trace %s", tp, v.TraceID)
	}
	var msg job.Message
	if err := json.Unmarshal(m.Data, &msg); err != nil {
		t.Fatal(err)
	}
	if msg.ID != v.ID || msg.TraceID != v.TraceID || msg.Spec.Runtime != "python" ||
		msg.Spec.Limits.MemoryMB != 128 || msg.Spec.Limits.TimeoutMS != job.DefaultLimits.TimeoutMS {
		t.Fatalf("message: %+v", msg)
	}
	if msg.Tenant != job.DefaultTenant || msg.Key != job.ScopedKey("tenant:"+job.DefaultTenant, msg.Spec, testDigest) || msg.Key != msg.CacheKey(testDigest) {
		t.Fatal("message key is not the tenant's scoped job.Key of the resolved spec and the registry digest")
	}

	g := b.do(t, http.MethodGet, "/v1/jobs/"+v.ID, "")
	var got pendingView
	g.decode(t, &got)
	if g.StatusCode != 200 || got.Status != job.StatusQueued || got.TraceID != v.TraceID {
		t.Fatalf("GET: %d %s", g.StatusCode, g.body)
	}

	// The submit span carries the documented attributes and the trace id.
	var found bool
	for _, sp := range b.spans.GetSpans() {
		if sp.Name != ktrace.SpanSubmit {
			continue
		}
		found = true
		attrs := map[string]string{}
		for _, a := range sp.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		for k, want := range map[string]string{
			"kiln.job.id": v.ID, "kiln.runtime": "python", "kiln.cache.key": msg.Key,
			"kiln.code.sha256": job.CodeSHA256("print(1)"), "kiln.cache.hit": "false", "kiln.limits.memory_mb": "128",
		} {
			if attrs[k] != want {
				t.Errorf("span attribute %s = %q, want %q", k, attrs[k], want)
			}
		}
		if sp.SpanContext.TraceID().String() != v.TraceID {
			t.Errorf("span trace %s, answer %s", sp.SpanContext.TraceID(), v.TraceID)
		}
	}
	if !found {
		t.Fatal("no submit span")
	}
}

func TestSubmitContinuesIncomingTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	v := accepted(t, b.submit(t, `{"code":"print(2)"}`, "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01"))
	if v.TraceID != traceID {
		t.Fatalf("trace_id %s, want the caller's %s", v.TraceID, traceID)
	}
}

func TestCacheHitAnswersWithoutPublishing(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	b := setup(t, func(c *Config) { c.Now = clock.Now })
	const spec = `{"code":"print('hi')","stdin":"in","args":["a"],"env":{"X":"1"},"files":[{"name":"f.txt","content":"c"}],"limits":{"memory_mb":128}}`
	first := accepted(t, b.submit(t, spec))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.worker(t, ctx, succeeded("hi\n")); err != nil {
		t.Fatal(err)
	}
	before := b.streamMsgs(t)

	r := b.submit(t, spec)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 (cache hit); body %s", r.StatusCode, r.body)
	}
	var res job.Result
	r.decode(t, &res)
	if !res.CacheHit || res.Stdout != "hi\n" || res.Status != job.StatusSucceeded || res.ID == first.ID || !job.ValidID(res.ID) || res.CreatedAt == nil {
		t.Fatalf("cache hit answer: %s", r.body)
	}
	if after := b.streamMsgs(t); after != before {
		t.Fatalf("cache hit published: stream went from %d to %d messages", before, after)
	}

	// Every input of the key makes a miss.
	base := map[string]any{}
	if err := json.Unmarshal([]byte(spec), &base); err != nil {
		t.Fatal(err)
	}
	muts := map[string]func(m map[string]any){
		"code":   func(m map[string]any) { m["code"] = "print('ho')" },
		"stdin":  func(m map[string]any) { m["stdin"] = "other" },
		"args":   func(m map[string]any) { m["args"] = []string{"b"} },
		"files":  func(m map[string]any) { m["files"] = []map[string]string{{"name": "f.txt", "content": "d"}} },
		"env":    func(m map[string]any) { m["env"] = map[string]string{"X": "2"} },
		"limits": func(m map[string]any) { m["limits"] = map[string]int{"memory_mb": 129} },
	}
	for name, mut := range muts {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		mut(m)
		n := b.streamMsgs(t)
		accepted(t, b.submit(t, jsonBody(t, m)))
		if b.streamMsgs(t) != n+1 {
			t.Errorf("changing %s did not publish a new job", name)
		}
	}

	// cache:false always runs, even when the result is cached.
	off := strings.Replace(spec, `{"code"`, `{"cache":false,"code"`, 1)
	n := b.streamMsgs(t)
	accepted(t, b.submit(t, off))
	accepted(t, b.submit(t, off))
	if got := b.streamMsgs(t); got != n+2 {
		t.Fatalf("cache:false: %d new messages, want 2", got-n)
	}

	// A new image digest is a new key: the old result no longer answers.
	registerPython(t, b.store, "sha256:2222222222222222222222222222222222222222222222222222222222222222")
	clock.Advance(b.srv.cfg.RuntimeCacheTTL) // the API reads the registry again
	n = b.streamMsgs(t)
	accepted(t, b.submit(t, spec))
	if b.streamMsgs(t) != n+1 {
		t.Fatal("new image digest still answered from the cache")
	}
}

func TestIdenticalConcurrentSubmissionsRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.submit(t, `{"code":"import time; time.sleep(1)"}`)
			var v pendingView
			if err := json.Unmarshal(r.body, &v); err != nil || r.StatusCode != http.StatusAccepted {
				t.Errorf("submission %d: %d %s", i, r.StatusCode, r.body)
				return
			}
			ids[i] = v.ID
		}()
	}
	wg.Wait()
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("%d identical submissions put %d messages on the stream, want 1", n, got)
	}
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("submission %d answered job %s, submission 0 job %s", i, id, ids[0])
		}
	}
	if recs, claims := b.jobKeys(t); recs != 1 || claims != 1 {
		t.Fatalf("%d records and %d in-flight claims left, want 1 and 1", recs, claims)
	}
}

func TestSubmitWaitReturnsResultInOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := b.worker(t, ctx, succeeded("42\n"))
		errc <- err
	}()
	start := time.Now()
	r := b.do(t, http.MethodPost, "/v1/jobs?wait=20s", `{"code":"print(42)"}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", r.StatusCode, r.body)
	}
	var res job.Result
	r.decode(t, &res)
	if res.Stdout != "42\n" || res.Status != job.StatusSucceeded || res.Code() != 0 || res.Worker != "test-worker" ||
		res.Attempt != 1 || res.StartedAt == nil || res.FinishedAt == nil || res.CreatedAt == nil || res.TraceID == "" {
		t.Fatalf("result: %s", r.body)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("wait took %v: woke by timeout, not by the notice", el)
	}
}

func TestLongPollWakesOnNotice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := accepted(t, b.submit(t, `{"code":"print(7)"}`))
	type got struct {
		r  response
		at time.Time
	}
	done := make(chan got, 1)
	start := time.Now()
	go func() {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+v.ID+"?wait=30s", "")
		done <- got{r, time.Now()}
	}()
	// The waiter must still be waiting: the job is queued.
	b.awaitLongPoll(t, v.ID)
	testkit.Quiet(t, done, 300*time.Millisecond, "the long-poll returning before the job finished")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.worker(t, ctx, succeeded("7\n")); err != nil {
		t.Fatal(err)
	}
	finished := time.Now()
	g := <-done
	if g.r.StatusCode != 200 {
		t.Fatalf("status %d: %s", g.r.StatusCode, g.r.body)
	}
	var res job.Result
	g.r.decode(t, &res)
	if res.Status != job.StatusSucceeded || res.Stdout != "7\n" {
		t.Fatalf("result: %s", g.r.body)
	}
	if lag := g.at.Sub(finished); lag > 2*time.Second || g.at.Sub(start) > 15*time.Second {
		t.Fatalf("long-poll answered %v after the notice: it did not wake on it", lag)
	}
}

func TestGetWaitTimesOutWithCurrentStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := accepted(t, b.submit(t, `{"code":"print(8)"}`))
	start := time.Now()
	r := b.do(t, http.MethodGet, "/v1/jobs/"+v.ID+"?wait=300ms", "")
	if el := time.Since(start); el < 250*time.Millisecond || el > 5*time.Second {
		t.Fatalf("wait=300ms took %v", el)
	}
	var got pendingView
	r.decode(t, &got)
	if r.StatusCode != 200 || got.Status != job.StatusQueued {
		t.Fatalf("%d %s", r.StatusCode, r.body)
	}
	// POST ?wait= that times out answers 202.
	r = b.do(t, http.MethodPost, "/v1/jobs?wait=200ms", `{"code":"print(9)"}`)
	accepted(t, r)
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const spec = `{"code":"print(1)","cache":false}`
	a := accepted(t, b.submit(t, spec, "Idempotency-Key", "k-1"))
	again := accepted(t, b.submit(t, spec, "Idempotency-Key", "k-1"))
	if again.ID != a.ID {
		t.Fatalf("replay answered job %s, first %s", again.ID, a.ID)
	}
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("%d messages, want 1", got)
	}
	p := b.submit(t, `{"code":"print(2)","cache":false}`, "Idempotency-Key", "k-1").problem(t, http.StatusUnprocessableEntity)
	if p.Field != "Idempotency-Key" || !strings.Contains(p.Detail, a.ID) || !strings.Contains(p.Detail, "different request body") {
		t.Fatalf("problem: %+v", p)
	}
	other := accepted(t, b.submit(t, spec, "Idempotency-Key", "k-2"))
	if other.ID == a.ID {
		t.Fatal("a new key answered the old job")
	}
}

func TestQueueFullAnswers429AndLeavesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Queue.MaxMsgs = 1 })
	accepted(t, b.submit(t, `{"code":"print(1)"}`))
	r := b.submit(t, `{"code":"print(2)"}`)
	p := r.problem(t, http.StatusTooManyRequests)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(p.Detail, "queue") {
		t.Fatalf("429 without Retry-After or explanation: %v %+v", r.Header, p)
	}
	if recs, claims := b.jobKeys(t); recs != 1 || claims != 1 {
		t.Fatalf("%d records and %d claims left, want only the first job's", recs, claims)
	}
}

func TestNATSDownAnswers503AndLeavesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.nats.Stop()
	r := b.submit(t, `{"code":"print(1)"}`)
	p := r.problem(t, http.StatusServiceUnavailable)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(p.Detail, "NATS") {
		t.Fatalf("503: %v %+v", r.Header, p)
	}
	if recs, claims := b.jobKeys(t); recs != 0 || claims != 0 {
		t.Fatalf("%d records and %d claims left after a failed publish", recs, claims)
	}
	rz := b.do(t, http.MethodGet, "/readyz", "")
	if p := rz.problem(t, http.StatusServiceUnavailable); p.Checks["nats"] == "ok" || p.Checks["redis"] != "ok" {
		t.Fatalf("readyz: %s", rz.body)
	}
}

func TestRedisDownAnswers503ThenRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	accepted(t, b.submit(t, `{"code":"print(1)"}`))
	b.redis.Stop()
	r := b.submit(t, `{"code":"print(2)"}`)
	p := r.problem(t, http.StatusServiceUnavailable)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(p.Detail, "Redis") {
		t.Fatalf("503: %v %+v", r.Header, p)
	}
	rz := b.do(t, http.MethodGet, "/readyz", "")
	if p := rz.problem(t, http.StatusServiceUnavailable); p.Checks["redis"] == "ok" || !strings.Contains(p.Detail, "Redis") {
		t.Fatalf("readyz: %s", rz.body)
	}
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("%d messages on the stream, want 1 (nothing published while Redis was down)", got)
	}
	b.redis.Start()
	accepted(t, b.submit(t, `{"code":"print(3)"}`))
	if rz := b.do(t, http.MethodGet, "/readyz", ""); rz.StatusCode != 200 {
		t.Fatalf("readyz after restart: %d %s", rz.StatusCode, rz.body)
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, http.MethodPost, "/v1/jobs/batch", `{"jobs":[{"code":"print(1)"},{"code":""},{"code":"print(3)","limits":{"pids":99999}}, {"code":"x","bogus":1}]}`)
	if r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, r.body)
	}
	var out struct {
		Jobs []struct {
			Index  int          `json:"index"`
			Status int          `json:"status"`
			Job    *pendingView `json:"job"`
			Error  *problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &out)
	if len(out.Jobs) != 4 {
		t.Fatalf("%d items: %s", len(out.Jobs), r.body)
	}
	if it := out.Jobs[0]; it.Index != 0 || it.Status != 202 || it.Job == nil || !job.ValidID(it.Job.ID) {
		t.Fatalf("item 0: %s", r.body)
	}
	if it := out.Jobs[1]; it.Index != 1 || it.Status != 422 || it.Error == nil || it.Error.Field != "jobs[1].code" {
		t.Fatalf("item 1: %s", r.body)
	}
	if it := out.Jobs[2]; it.Status != 422 || it.Error.Field != "jobs[2].limits.pids" || !strings.Contains(it.Error.Detail, "maximum is 1024") {
		t.Fatalf("item 2: %s", r.body)
	}
	if it := out.Jobs[3]; it.Status != 400 || it.Error.Field != "jobs[3].bogus" {
		t.Fatalf("item 3: %s", r.body)
	}
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("%d messages, want 1", got)
	}

	jobs := make([]string, 101)
	for i := range jobs {
		jobs[i] = fmt.Sprintf(`{"code":"print(%d)"}`, i)
	}
	p := b.do(t, http.MethodPost, "/v1/jobs/batch", `{"jobs":[`+strings.Join(jobs, ",")+`]}`).problem(t, http.StatusUnprocessableEntity)
	if p.Limit != 100 || !strings.Contains(p.Detail, "maximum is 100") || p.Field != "jobs" {
		t.Fatalf("101 jobs: %+v", p)
	}
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("an oversized batch published %d jobs", got-1)
	}
}

func TestCoalescingRepublishesALeaderThatWasNeverPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A process recorded and claimed this job, then died before publishing.
	spec := job.Spec{Runtime: "python", Code: "print('orphan')"}
	var err error
	if spec.Limits, err = job.DefaultPolicy().Resolve(spec.Limits); err != nil {
		t.Fatal(err)
	}
	orphan := job.Message{ID: job.NewID(), Spec: spec, Key: job.ScopedKey("tenant:"+job.DefaultTenant, spec, testDigest),
		CreatedAt: time.Now().UTC(), Tenant: job.DefaultTenant, CacheScope: "tenant:" + job.DefaultTenant}
	ctx := context.Background()
	if err := b.store.CreateJob(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := b.store.ClaimInflight(ctx, orphan.Key, orphan.ID); err != nil || !claimed {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	for range 3 {
		if v := accepted(t, b.submit(t, `{"code":"print('orphan')"}`)); v.ID != orphan.ID {
			t.Fatalf("answered %s, want the in-flight job %s", v.ID, orphan.ID)
		}
	}
	if got := b.streamMsgs(t); got != 1 {
		t.Fatalf("%d messages on the stream, want the orphan's once", got)
	}
	s, err := b.js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, job.TenantJobSubject("python", job.DefaultTenant))
	if err != nil || m.Header.Get(job.HeaderMsgID) != orphan.ID {
		t.Fatalf("message: %v %v", m, err)
	}
}

func TestPublishFailureWithNATSUpAnswers503AndLeavesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.PublishTimeout = 500 * time.Millisecond })
	// The stream is gone: JetStream cannot store the job although NATS answers.
	if err := b.js.DeleteStream(context.Background(), job.StreamName); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := b.submit(t, `{"code":"print(1)"}`)
	p := r.problem(t, http.StatusServiceUnavailable)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(p.Detail, "nothing was queued") {
		t.Fatalf("503: %v %+v", r.Header, p)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("answer took %v; the publish timeout is 500ms", el)
	}
	if recs, claims := b.jobKeys(t); recs != 0 || claims != 0 {
		t.Fatalf("%d records and %d claims left after a failed publish", recs, claims)
	}
}
