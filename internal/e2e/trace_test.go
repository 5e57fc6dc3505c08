package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
)

// memTracing is a tracer provider whose spans a test can read as they end.
func memTracing() (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), exp
}

// traceSpans is one trace's ended spans by name, in the order they ended.
type traceSpans map[string][]tracetest.SpanStub

func spansOf(exp *tracetest.InMemoryExporter, traceID string) traceSpans {
	out := traceSpans{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID().String() == traceID {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

// has reports whether every name has ended at least once.
func (ts traceSpans) has(names ...string) bool {
	for _, n := range names {
		if len(ts[n]) == 0 {
			return false
		}
	}
	return true
}

// one returns the only span called name.
func (ts traceSpans) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	if n := len(ts[name]); n != 1 {
		t.Fatalf("trace has %d %q spans; want 1 (spans: %v)", n, name, ts.names())
	}
	return ts[name][0]
}

// under returns the one span called name whose parent is parent.
func (ts traceSpans) under(t *testing.T, name string, parent tracetest.SpanStub) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range ts[name] {
		if s.Parent.SpanID() == parent.SpanContext.SpanID() {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("trace has %d %q spans under %q; want 1 (spans: %v)", len(found), name, parent.Name, ts.names())
	}
	return found[0]
}

func (ts traceSpans) names() []string {
	var out []string
	for n, ss := range ts {
		out = append(out, fmt.Sprintf("%s×%d", n, len(ss)))
	}
	slices.Sort(out)
	return out
}

func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// checkAttrs compares the attributes of span s with want.
func checkAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("span %s: %s = %q (set: %v); want %q", s.Name, k, g, ok, v)
		}
	}
}

// checkParent asserts that child's parent is parent, in parent's trace.
func checkParent(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.SpanContext.TraceID() != parent.SpanContext.TraceID() || child.Parent.SpanID() != parent.SpanContext.SpanID() {
		t.Errorf("span %s has parent %s in trace %s; want %s %s in trace %s", child.Name,
			child.Parent.SpanID(), child.SpanContext.TraceID(), parent.Name, parent.SpanContext.SpanID(), parent.SpanContext.TraceID())
	}
}

// checkNoSecret fails when any part of any span the exporter holds carries
// marker: attributes, status, events, links.
func checkNoSecret(t *testing.T, exp *tracetest.InMemoryExporter, marker string) {
	t.Helper()
	for _, s := range exp.GetSpans() {
		where := func(what string) { t.Errorf("span %s: %s carries code, input or output (%q)", s.Name, what, marker) }
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.Emit(), marker) {
				where("attribute " + string(kv.Key))
			}
		}
		if strings.Contains(s.Status.Description, marker) {
			where("status")
		}
		for _, ev := range s.Events {
			if strings.Contains(ev.Name, marker) {
				where("event name")
			}
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.Emit(), marker) {
					where("event attribute " + string(kv.Key))
				}
			}
		}
		for _, l := range s.Links {
			for _, kv := range l.Attributes {
				if strings.Contains(kv.Value.Emit(), marker) {
					where("link attribute " + string(kv.Key))
				}
			}
		}
	}
}

func limitAttrs(l job.Limits) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range ktrace.LimitAttrs(l) {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

func merge(ms ...map[attribute.Key]string) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// waitJobTrace submits spec, waits for its result and for every span names
// lists to have ended in its trace.
func waitJobTrace(t *testing.T, e *env, exp *tracetest.InMemoryExporter, spec job.Spec, names ...string) (client.Submission, client.JobView, traceSpans) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.TraceID != sub.TraceID || sub.TraceID == "" {
		t.Fatalf("job %s: submit answered trace %q, result has %q", sub.ID, sub.TraceID, v.TraceID)
	}
	// The result is written before the worker ends its spans: wait for them.
	var spans traceSpans
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("spans %v of job %s", names, sub.ID), func() bool {
		spans = spansOf(exp, sub.TraceID)
		return spans.has(names...)
	})
	return sub, v, spans
}

var jobSpanNames = []string{
	ktrace.SpanSubmit, ktrace.SpanCacheLookup, ktrace.SpanCacheStore, ktrace.SpanQueue, ktrace.SpanExecute,
	ktrace.SpanSandboxCreate, ktrace.SpanSandboxStart, ktrace.SpanSandboxWait, ktrace.SpanSandboxCollect,
}

// Acceptance 1 (issue 4): one job submitted through the API and run by a
// real worker on containerd is one trace: submit (with cache.lookup and
// cache.store below it) → queue → execute → sandbox.create / start / wait /
// collect, each with the attributes operators search by, and the digest on
// sandbox.create is the digest the result says ran. Failures mark the
// execute span as an error with their category; a cache hit is a trace of
// its own that runs nothing. Code, stdin, args, env, files and output never
// reach a span.
func TestTraceOfOneJob(t *testing.T) {
	tp, exp := memTracing()
	e := setup(t, withTracerProvider(tp))
	const workerID = "e2e-trace"
	// A container of its own: every sandbox step is in the job's trace (a
	// box job's: TestBoxAndPooledJobTracesCarryTheDigest).
	e.startWorker(t, workerID, 1, withBoxesOff())
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	const secret = "k1ln-s3cr3t"
	spec := job.Spec{
		Runtime: "python",
		Code: "import os, sys\nprint(sys.stdin.read(), sys.argv[1], os.environ['K'], open('f.txt').read())\n" +
			"print('" + secret + "-stderr', file=sys.stderr)  # " + secret,
		Stdin: secret + "-stdin", Args: []string{secret + "-arg"}, Env: map[string]string{"K": secret + "-env"},
		Files: []job.File{{Name: "f.txt", Content: secret + "-file"}},
	}
	sub, v, spans := waitJobTrace(t, e, exp, spec, jobSpanNames...)
	if v.Status != job.StatusSucceeded || !strings.Contains(v.Stdout, secret+"-file") || v.Limits == nil {
		t.Fatalf("job: %s %+v stdout %q limits %v", v.Status, v.Error, v.Stdout, v.Limits)
	}

	submit := spans.one(t, ktrace.SpanSubmit)
	lookup := spans.one(t, ktrace.SpanCacheLookup)
	queue := spans.one(t, ktrace.SpanQueue)
	execute := spans.one(t, ktrace.SpanExecute)
	// cache.store twice: the API records the job, the worker stores its result.
	if n := len(spans[ktrace.SpanCacheStore]); n != 2 {
		t.Fatalf("trace has %d cache.store spans; want 2 (job record, result) (spans: %v)", n, spans.names())
	}
	store := spans.under(t, ktrace.SpanCacheStore, submit)
	resultStore := spans.under(t, ktrace.SpanCacheStore, execute)
	create := spans.one(t, ktrace.SpanSandboxCreate)
	start := spans.one(t, ktrace.SpanSandboxStart)
	wait := spans.one(t, ktrace.SpanSandboxWait)
	collect := spans.one(t, ktrace.SpanSandboxCollect)
	for n := range spans {
		if !slices.Contains(jobSpanNames, n) {
			t.Errorf("unexpected span %q in the job's trace", n)
		}
	}

	// Parent/child: the client sent no trace context, so submit is the root;
	// queue continues it across NATS (a remote parent); the rest nest locally.
	if submit.Parent.IsValid() {
		t.Errorf("submit span has parent %s; want a root span", submit.Parent.SpanID())
	}
	if submit.SpanKind != trace.SpanKindServer || execute.SpanKind != trace.SpanKindConsumer {
		t.Errorf("span kinds: submit %s, execute %s; want server, consumer", submit.SpanKind, execute.SpanKind)
	}
	checkParent(t, lookup, submit)
	checkParent(t, store, submit)
	checkParent(t, queue, submit)
	if !queue.Parent.IsRemote() {
		t.Errorf("queue span's parent is not remote: the context did not come through the NATS headers")
	}
	checkParent(t, execute, queue)
	for _, s := range []tracetest.SpanStub{create, start, wait, collect} {
		checkParent(t, s, execute)
	}
	// The sandbox steps run one after the other inside execute.
	steps := []tracetest.SpanStub{create, start, wait, collect}
	for i, s := range steps {
		if s.StartTime.Before(execute.StartTime) || s.EndTime.After(execute.EndTime) {
			t.Errorf("span %s [%v, %v] lies outside execute [%v, %v]", s.Name, s.StartTime, s.EndTime, execute.StartTime, execute.EndTime)
		}
		if i > 0 && s.StartTime.Before(steps[i-1].EndTime) {
			t.Errorf("span %s starts before %s ended", s.Name, steps[i-1].Name)
		}
	}

	sha := job.CodeSHA256(spec.Code)
	cacheKey := attrs(submit)[ktrace.CacheKeyKey]
	if len(cacheKey) < 32 {
		t.Errorf("submit span kiln.cache.key = %q; want the job's cache key", cacheKey)
	}
	limits := limitAttrs(*v.Limits) // what the sandbox enforced
	checkAttrs(t, submit, merge(limits, map[attribute.Key]string{
		ktrace.JobIDKey: sub.ID, ktrace.RuntimeKey: "python", ktrace.CodeSHA256Key: sha, ktrace.CacheHitKey: "false",
	}))
	checkAttrs(t, lookup, map[attribute.Key]string{ktrace.CacheKeyKey: cacheKey, ktrace.CacheHitKey: "false"})
	checkAttrs(t, store, map[attribute.Key]string{ktrace.JobIDKey: sub.ID})
	checkAttrs(t, resultStore, map[attribute.Key]string{ktrace.JobIDKey: sub.ID, ktrace.CacheKeyKey: cacheKey})
	if resultStore.StartTime.Before(collect.EndTime) {
		t.Errorf("the result was stored in the cache before sandbox.collect ended")
	}
	checkAttrs(t, queue, map[attribute.Key]string{ktrace.JobIDKey: sub.ID, ktrace.AttemptKey: "1"})
	if _, ok := attrs(queue)[ktrace.QueueWaitMSKey]; !ok {
		t.Errorf("queue span has no %s", ktrace.QueueWaitMSKey)
	}
	checkAttrs(t, execute, merge(limits, map[attribute.Key]string{
		ktrace.JobIDKey: sub.ID, ktrace.AttemptKey: "1", ktrace.RuntimeKey: "python", ktrace.WorkerIDKey: workerID,
		ktrace.HostNameKey: host, ktrace.CodeSHA256Key: sha, ktrace.CacheKeyKey: cacheKey,
		ktrace.StatusKey: string(job.StatusSucceeded), ktrace.ExitCodeKey: "0",
	}))
	if execute.Status.Code == codes.Error {
		t.Errorf("execute span of a succeeded job has status %v", execute.Status)
	}

	// The digest the sandbox traced is the digest the result reports, which
	// is the image containerd holds for the runtime now.
	if v.Image.Digest == "" || !strings.HasPrefix(v.Image.Digest, "sha256:") {
		t.Fatalf("result image %+v: want a sha256 digest", v.Image)
	}
	checkAttrs(t, create, map[attribute.Key]string{
		ktrace.OCIManifestDigestKey: v.Image.Digest, ktrace.ContainerImageNameKey: v.Image.Name, ktrace.JobIDKey: sub.ID,
	})
	sb, err := sandbox.New(context.Background(), sandbox.Config{Address: e.containerd, Namespace: testenv.ContainerdNamespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if img, err := sb.Image(context.Background(), "python"); err != nil || img.Digest != v.Image.Digest {
		t.Errorf("containerd has %+v (%v) for python; the job ran %s", img, err, v.Image.Digest)
	}
	containerID := attrs(create)[ktrace.ContainerIDKey]
	if !strings.HasPrefix(containerID, sub.ID+"-") {
		t.Errorf("container.id %q; want the job id %s with a suffix", containerID, sub.ID)
	}
	for _, s := range []tracetest.SpanStub{start, wait, collect} {
		checkAttrs(t, s, map[attribute.Key]string{ktrace.ContainerIDKey: containerID, ktrace.JobIDKey: sub.ID})
	}
	checkAttrs(t, wait, map[attribute.Key]string{ktrace.ExitCodeKey: "0"})
	if v.MemoryPeakBytes <= 0 || v.StdoutBytes <= 0 || v.StderrBytes <= 0 {
		t.Errorf("result figures: memory peak %d, stdout %d, stderr %d bytes; want all > 0", v.MemoryPeakBytes, v.StdoutBytes, v.StderrBytes)
	}
	checkAttrs(t, collect, map[attribute.Key]string{
		ktrace.StatusKey: string(job.StatusSucceeded), ktrace.ExitCodeKey: "0",
		ktrace.CPUTimeMSKey:   fmt.Sprint(v.CPUMS),
		ktrace.MemoryPeakKey:  fmt.Sprint(v.MemoryPeakBytes),
		ktrace.OutputBytesKey: fmt.Sprint(v.StdoutBytes + v.StderrBytes),
	})

	// A failing program: the execute span is an error with the category.
	failing := py("import sys\nprint('%s-boom', file=sys.stderr)\nsys.exit(3)", secret)
	_, fv, fspans := waitJobTrace(t, e, exp, failing, ktrace.SpanExecute, ktrace.SpanSandboxCollect)
	if fv.Status != job.StatusFailed || fv.Error == nil || fv.Error.Category != job.CategoryRuntimeError {
		t.Fatalf("failing job: %s %+v", fv.Status, fv.Error)
	}
	fexec := fspans.one(t, ktrace.SpanExecute)
	if fexec.Status.Code != codes.Error {
		t.Errorf("execute span of a failed job has status %v; want Error", fexec.Status)
	}
	checkAttrs(t, fexec, map[attribute.Key]string{
		ktrace.ErrorCategoryKey: string(job.CategoryRuntimeError), ktrace.StatusKey: string(job.StatusFailed), ktrace.ExitCodeKey: "3",
	})
	checkAttrs(t, fspans.one(t, ktrace.SpanSandboxCollect), map[attribute.Key]string{ktrace.StatusKey: string(job.StatusFailed), ktrace.ExitCodeKey: "3"})

	// A timeout: the same, with its own category.
	slow := py("import time\ntime.sleep(30)")
	slow.Limits.TimeoutMS = 500
	_, tv, tspans := waitJobTrace(t, e, exp, slow, ktrace.SpanExecute)
	if tv.Status != job.StatusTimedOut {
		t.Fatalf("slow job: %s %+v", tv.Status, tv.Error)
	}
	texec := tspans.one(t, ktrace.SpanExecute)
	if texec.Status.Code != codes.Error {
		t.Errorf("execute span of a timed-out job has status %v; want Error", texec.Status)
	}
	checkAttrs(t, texec, map[attribute.Key]string{
		ktrace.ErrorCategoryKey: string(job.CategoryTimeout), ktrace.StatusKey: string(job.StatusTimedOut), ktrace.LimitTimeoutMSKey: "500",
	})

	// The first job again: a cache hit is its own trace, answered by the API alone.
	before := e.runs.total.Load()
	hit, err := e.api.Submit(context.Background(), spec)
	if err != nil || !hit.CacheHit || hit.TraceID == "" || hit.TraceID == sub.TraceID {
		t.Fatalf("resubmission: %+v %v; want a cache hit with a trace of its own", hit, err)
	}
	var hspans traceSpans
	testkit.Eventually(t, 10*time.Second, "cache hit spans", func() bool {
		hspans = spansOf(exp, hit.TraceID)
		return hspans.has(ktrace.SpanSubmit, ktrace.SpanCacheLookup)
	})
	checkAttrs(t, hspans.one(t, ktrace.SpanSubmit), map[attribute.Key]string{ktrace.CacheHitKey: "true", ktrace.CacheKeyKey: cacheKey})
	checkAttrs(t, hspans.one(t, ktrace.SpanCacheLookup), map[attribute.Key]string{ktrace.CacheHitKey: "true"})
	if got := hspans.names(); len(got) != 2 || e.runs.total.Load() != before {
		t.Errorf("cache hit trace has spans %v and ran %d jobs; want submit and cache.lookup only, nothing run", got, e.runs.total.Load()-before)
	}

	checkNoSecret(t, exp, secret)
}
