package trace

import (
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func TestLimitAttrs(t *testing.T) {
	t.Parallel()
	l := job.Limits{TimeoutMS: 1, MemoryMB: 2, CPUMS: 3, Pids: 4, OutputBytes: 5, DiskMB: 6}
	want := map[string]int64{
		"kiln.limits.timeout_ms": 1, "kiln.limits.memory_mb": 2, "kiln.limits.cpu_ms": 3,
		"kiln.limits.pids": 4, "kiln.limits.output_bytes": 5, "kiln.limits.disk_mb": 6,
	}
	got := LimitAttrs(l)
	if len(got) != len(want) {
		t.Fatalf("LimitAttrs returned %d attributes; want %d", len(got), len(want))
	}
	for _, kv := range got {
		if w, ok := want[string(kv.Key)]; !ok || kv.Value.AsInt64() != w {
			t.Errorf("%s = %v; want %d (known %v)", kv.Key, kv.Value.Emit(), w, ok)
		}
	}
}

// TestAttributeNames pins the names back ends and dashboards query by.
func TestAttributeNames(t *testing.T) {
	t.Parallel()
	semconv := map[string]string{
		string(ContainerImageNameKey): "container.image.name",
		string(OCIManifestDigestKey):  "oci.manifest.digest",
		string(ContainerIDKey):        "container.id",
		string(HostNameKey):           "host.name",
	}
	for got, want := range semconv {
		if got != want {
			t.Errorf("semantic-convention key %q; want %q", got, want)
		}
	}
	for _, k := range []string{
		string(JobIDKey), string(CodeSHA256Key), string(CacheKeyKey), string(CacheHitKey), string(RuntimeKey),
		string(AttemptKey), string(ExitCodeKey), string(StatusKey), string(ErrorCategoryKey), string(CPUTimeMSKey),
		string(MemoryPeakKey), string(OutputBytesKey), string(QueueWaitMSKey), string(WorkerIDKey),
	} {
		if !strings.HasPrefix(k, "kiln.") {
			t.Errorf("Kiln attribute %q lacks the kiln. prefix", k)
		}
	}
}
