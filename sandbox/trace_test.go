package sandbox

import (
	"slices"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// TestSpans: one run makes the four sandbox spans with the attributes an
// operator searches by, and never the code or its output.
func TestSpans(t *testing.T) {
	t.Parallel()
	addr := testenv.Containerd(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	rt, err := New(t.Context(), Config{Address: addr, Namespace: testenv.ContainerdNamespace(), WorkerID: testWorkerID, Init: testInit, TracerProvider: tp,
		Isolation: testIsolationOverride(ImagesDefault()), Boxes: BoxConfig{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Image(t.Context(), "python"); err != nil {
		testenv.Unavailable(t, "python sandbox image: %v", err)
	}
	const secret = "s3cr3t-code-marker"
	id := job.NewID()
	// The worker runs the sandbox under its execute span: every sandbox step
	// is a direct child of it.
	ctx, parent := tp.Tracer("test").Start(t.Context(), "execute")
	res, err := rt.Run(ctx, Request{ID: id, Spec: py("print('" + secret + "-out')  # " + secret)})
	parent.End()
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("run: %v %s", err, res.Status)
	}
	attrs := map[string]map[string]string{}
	var names []string
	for _, s := range exp.GetSpans() {
		if s.Name == "execute" {
			continue
		}
		names = append(names, s.Name)
		if s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanContext.TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("span %s has parent %s; want the caller's span %s", s.Name, s.Parent.SpanID(), parent.SpanContext().SpanID())
		}
		m := map[string]string{}
		for _, kv := range s.Attributes {
			v := kv.Value.Emit()
			if strings.Contains(v, secret) {
				t.Errorf("span %s attribute %s carries the code or output", s.Name, kv.Key)
			}
			m[string(kv.Key)] = v
		}
		attrs[s.Name] = m
	}
	if want := []string{"sandbox.create", "sandbox.start", "sandbox.wait", "sandbox.collect"}; !slices.Equal(names, want) {
		t.Fatalf("spans %q; want %q", names, want)
	}
	for _, s := range names {
		if attrs[s]["kiln.job.id"] != id || !strings.HasPrefix(attrs[s]["container.id"], id+"-") {
			t.Errorf("span %s: job id %q container id %q", s, attrs[s]["kiln.job.id"], attrs[s]["container.id"])
		}
	}
	c := attrs["sandbox.create"]
	if c["container.image.name"] != res.Image.Name || c["oci.manifest.digest"] != res.Image.Digest {
		t.Errorf("create span image %q %q; result %+v", c["container.image.name"], c["oci.manifest.digest"], res.Image)
	}
	if c["kiln.sandbox.isolation"] != string(testIsolation()) {
		t.Errorf("create span isolation %q; want %q", c["kiln.sandbox.isolation"], testIsolation())
	}
	if attrs["sandbox.wait"]["kiln.exit_code"] != "0" {
		t.Errorf("wait span exit code %q", attrs["sandbox.wait"]["kiln.exit_code"])
	}
	col := attrs["sandbox.collect"]
	if col["kiln.output.bytes"] != "23" || col["kiln.cpu_time_ms"] == "" || col["kiln.memory.peak_bytes"] == "" || col["kiln.memory.peak_bytes"] == "0" {
		t.Errorf("collect span attributes %v", col)
	}
}
