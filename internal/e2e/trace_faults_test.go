package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/otlptest"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Traces across faults: a redelivered job, a collector that is down, and
// the image digest on every path that prepares a sandbox.

// received returns the spans of trace traceID called name that rec received.
func received(rec *otlptest.Receiver, traceID, name string) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range rec.Spans() {
		if hex.EncodeToString(s.GetTraceId()) == traceID && s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

// Acceptance 3 (issue 4): a job whose worker is SIGKILLed mid-run and that a
// second worker finishes shows both attempts in the submit span's trace.
//
// What a killed worker can prove is limited: a process killed with SIGKILL
// flushes nothing, and its execute span never ends, so attempt 1's execute
// span can never be exported. What it exports before the kill are the spans
// that ended: the queue span (ended the moment the worker took the job) and
// the sandbox.create and sandbox.start spans (ended before the program runs).
// The victim therefore exports with a 50 ms batch delay, and the test kills
// it only after the receiver has those spans. The assertions: attempt 1's
// queue span (kiln.attempt=1, from the victim's process and resource) and
// attempt 2's queue span (kiln.attempt=2, from the rescuer) are both children
// of the one submit span, in its trace; attempt 1's sandbox spans hang under
// an execute span other than attempt 2's; attempt 2's execute span finishes
// the job.
func TestTraceOfRedeliveredJob(t *testing.T) {
	tp, exp := memTracing()
	e := setup(t, withTracerProvider(tp))
	rec, recURL := otlptest.NewHTTP(t)
	const victimID = "e2e-trace-victim"
	// Containers of their own: each attempt's sandbox spans are in the
	// job's trace (a box's are in its own; TestBoxJobTrace).
	victim := e.workerProc(t, victimID, "OTEL_EXPORTER_OTLP_ENDPOINT="+recURL, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=e2e", "KILN_E2E_BOXES_OFF=1")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py("import time\ntime.sleep(4)\nprint('survived')"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, sub.ID, 30*time.Second, func(r cache.Record) bool { return r.Status == job.StatusRunning })
	testkit.Eventually(t, 10*time.Second, "attempt 1's queue and sandbox.start spans at the OTLP receiver", func() bool {
		return len(received(rec, sub.TraceID, ktrace.SpanQueue)) > 0 && len(received(rec, sub.TraceID, ktrace.SpanSandboxStart)) > 0
	})
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = victim.Process.Wait()
	if r, err := e.store.GetJob(ctx, sub.ID); err != nil || r.Status.Terminal() {
		t.Fatalf("job finished before its worker was killed (%s, %v): the test proves nothing", r.Status, err)
	}
	e.startWorker(t, "e2e-trace-rescuer", 1, withBoxesOff())
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || v.Attempt != 2 || v.TraceID != sub.TraceID {
		t.Fatalf("after the kill: %s attempt %d trace %s; want succeeded, attempt 2, trace %s", v.Status, v.Attempt, v.TraceID, sub.TraceID)
	}
	var spans traceSpans
	testkit.Eventually(t, 10*time.Second, "attempt 2's execute span", func() bool {
		spans = spansOf(exp, sub.TraceID)
		return spans.has(ktrace.SpanSubmit, ktrace.SpanQueue, ktrace.SpanExecute, ktrace.SpanSandboxStart)
	})
	submit := spans.one(t, ktrace.SpanSubmit)
	queue2 := spans.one(t, ktrace.SpanQueue)
	exec2 := spans.one(t, ktrace.SpanExecute)
	checkParent(t, queue2, submit)
	checkParent(t, exec2, queue2)
	checkAttrs(t, queue2, map[attribute.Key]string{ktrace.AttemptKey: "2", ktrace.JobIDKey: sub.ID})
	checkAttrs(t, exec2, map[attribute.Key]string{ktrace.AttemptKey: "2", ktrace.StatusKey: string(job.StatusSucceeded)})
	checkParent(t, spans.one(t, ktrace.SpanSandboxStart), exec2)

	q1s := received(rec, sub.TraceID, ktrace.SpanQueue)
	if len(q1s) != 1 {
		t.Fatalf("receiver has %d queue spans of the job; want 1 (attempt 1)", len(q1s))
	}
	q1 := q1s[0]
	sid := submit.SpanContext.SpanID()
	if !bytes.Equal(q1.GetParentSpanId(), sid[:]) {
		t.Errorf("attempt 1's queue span has parent %x; want the submit span %s", q1.GetParentSpanId(), sid)
	}
	if q1.Attrs[string(ktrace.AttemptKey)] != "1" || q1.Attrs[string(ktrace.JobIDKey)] != sub.ID {
		t.Errorf("attempt 1's queue span attributes %v; want kiln.attempt=1, kiln.job.id=%s", q1.Attrs, sub.ID)
	}
	if q1.Resource["service.name"] != "kiln-worker" || q1.Resource["deployment.environment.name"] != "e2e" || q1.Resource["host.name"] == "" {
		t.Errorf("attempt 1's spans came with resource %v; want the victim worker's", q1.Resource)
	}
	q2sid := queue2.SpanContext.SpanID()
	if bytes.Equal(q1.GetSpanId(), q2sid[:]) {
		t.Error("both attempts have the same queue span")
	}
	for _, name := range []string{ktrace.SpanSandboxCreate, ktrace.SpanSandboxStart} {
		ss := received(rec, sub.TraceID, name)
		if len(ss) != 1 {
			t.Errorf("receiver has %d %s spans of the job; want 1", len(ss), name)
			continue
		}
		e2sid := exec2.SpanContext.SpanID()
		if p := ss[0].GetParentSpanId(); len(p) == 0 || bytes.Equal(p, e2sid[:]) {
			t.Errorf("attempt 1's %s has parent %x; want attempt 1's own execute span", name, p)
		}
		if name == ktrace.SpanSandboxCreate && ss[0].Attrs[string(ktrace.OCIManifestDigestKey)] != v.Image.Digest {
			t.Errorf("attempt 1 ran digest %q; attempt 2 ran %q", ss[0].Attrs[string(ktrace.OCIManifestDigestKey)], v.Image.Digest)
		}
	}
}

// reapWorker removes containers a killed test worker left running.
func reapWorker(t *testing.T, containerd, workerID string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Config{Address: containerd, Namespace: testenv.ContainerdNamespace()})
	if err != nil {
		t.Logf("reap %s: %v", workerID, err)
		return
	}
	defer sb.Close()
	if _, err := sb.ReapOrphans(ctx, workerID); err != nil {
		t.Logf("reap %s: %v", workerID, err)
	}
}

// deadCollector is an OTLP endpoint that never answers (otlptest.NewHung).
func deadCollector(t *testing.T) (string, func() int64) {
	addr, accepted := otlptest.NewHung(t)
	return addr, func() int64 { return int64(accepted()) }
}

// refusingCollector is an address nothing listens on: connections are refused.
func refusingCollector(t *testing.T) (string, func() int64) {
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), nil
}

// Acceptance 6 (issue 4, the pipeline half; trace.TestSetupCollectorDown and
// trace.TestSetupWithoutEndpoint cover the providers alone): with the OTLP
// collector down, jobs run through the API and a worker as fast as without
// one, and the providers shut down within their deadline. Each export is
// allowed 30 s, so a pipeline waiting on even one export would take longer
// than the bound below; the small queue makes the exporters drop spans.
func TestJobsRunWithCollectorDown(t *testing.T) {
	for _, tc := range []struct {
		name, protocol string
		collector      func(t *testing.T) (string, func() int64)
	}{
		{"refused/http", ktrace.ProtocolHTTPProtobuf, refusingCollector},
		{"hung/http", ktrace.ProtocolHTTPProtobuf, deadCollector},
		{"hung/grpc", ktrace.ProtocolGRPC, deadCollector},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOTELEnv(t)
			addr, accepted := tc.collector(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
			t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
			cfg := ktrace.Config{MaxQueueSize: 16, ExportTimeout: 30 * time.Second}
			apiTel, apiMetrics := telemetryFor(t, "kiln-api", cfg)
			wkTel, wkMetrics := telemetryFor(t, "kiln-worker", cfg)
			e := setup(t, withProviders(apiTel, apiMetrics))
			e.startWorker(t, "e2e-collector-down", 2, withProviders(wkTel, wkMetrics))

			const jobs = 12
			const bound = 20 * time.Second // a dozen trivial jobs take a few seconds; one stalled export takes 30
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range jobs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sub, err := e.api.Submit(ctx, py("print(%d)", i), client.WithWait(bound))
					if err != nil {
						t.Errorf("job %d: %v", i, err)
						return
					}
					if sub.Status != job.StatusSucceeded || sub.Stdout != fmt.Sprintf("%d\n", i) {
						t.Errorf("job %d: %s %q %+v within %v", i, sub.Status, sub.Stdout, sub.Error, time.Since(start))
					}
				}()
			}
			wg.Wait()
			t.Logf("%d jobs in %v with the collector %s", jobs, time.Since(start).Round(time.Millisecond), tc.name)
			if accepted != nil {
				testkit.Eventually(t, 5*time.Second, "an export attempt at the dead collector", func() bool { return accepted() > 0 })
			}

			for _, p := range []*ktrace.Providers{apiTel, wkTel} {
				sctx, cancel := context.WithTimeout(context.Background(), time.Second)
				start := time.Now()
				err := p.Shutdown(sctx)
				cancel()
				took := time.Since(start)
				t.Logf("Shutdown returned after %v: %v", took.Round(time.Millisecond), err)
				if took > 3*time.Second {
					t.Errorf("Shutdown with a 1s deadline took %v", took)
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Shutdown: %v; want nil or the deadline", err)
				}
			}
		})
	}
}

// Acceptance (issue 22, 4): whatever prepared its sandbox, a job's trace
// carries the image name and digest it ran: a box job's execute span (the box
// was made before the job, outside its trace) and a pooled job's.
func TestBoxAndPooledJobTracesCarryTheDigest(t *testing.T) {
	for _, path := range []string{"box", "pooled"} {
		t.Run(path, func(t *testing.T) {
			tp, exp := memTracing()
			e := setup(t, withTracerProvider(tp))
			var opts []option
			var rt *sandbox.Containerd
			if path == "pooled" {
				opts = append(opts, withBoxesOff(), withPool(), withSandbox(func(c *sandbox.Containerd) { rt = c }))
			}
			e.startWorker(t, "e2e-trace-"+path, 1, opts...)
			// The first job may find nothing prepared yet: run until one
			// finds its box (or its pooled sandbox).
			want := map[string]string{"box": "true", "pooled": "true"}[path]
			key := map[string]attribute.Key{"box": ktrace.SandboxBoxKey, "pooled": ktrace.SandboxPooledKey}[path]
			var v client.JobView
			var execute tracetest.SpanStub
			testkit.Eventually(t, time.Minute, "a "+path+" job", func() bool {
				if rt != nil {
					// A pooled sandbox preloads the agent list before it
					// is ready: submit once one is, or every job may
					// find the pool still filling behind the last.
					testkit.Eventually(t, time.Minute, "a pooled sandbox ready", func() bool { return pooledIdle(rt) > 0 })
				}
				spec := job.Spec{Runtime: "python", Code: "print(1)", Cache: job.CacheOff()}
				var spans traceSpans
				_, v, spans = waitJobTrace(t, e, exp, spec, ktrace.SpanExecute)
				execute = spans.one(t, ktrace.SpanExecute)
				return attrs(execute)[key] == want
			})
			checkAttrs(t, execute, map[attribute.Key]string{
				ktrace.OCIManifestDigestKey: v.Image.Digest, ktrace.ContainerImageNameKey: v.Image.Name,
			})
			if !strings.HasPrefix(v.Image.Digest, "sha256:") {
				t.Errorf("result image %+v", v.Image)
			}
		})
	}
}

// pooledIdle is the number of python sandboxes rt's pool holds ready.
func pooledIdle(rt *sandbox.Containerd) int {
	for _, st := range rt.PoolStats() {
		if st.Runtime == "python" {
			return st.Idle
		}
	}
	return 0
}
