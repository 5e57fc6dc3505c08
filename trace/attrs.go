package trace

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/kilnrun/kiln/job"
)

// Span names. One job's trace is submit → queue → execute → sandbox.*, with
// cache.lookup and cache.store wherever the result cache is consulted. One
// session call's trace is session.call (the API, from acceptance to answer)
// → execute (the worker's run of it in the session's sandbox).
const (
	SpanSubmit         = "submit"
	SpanSessionCall    = "session.call"
	SpanQueue          = "queue"
	SpanExecute        = "execute"
	SpanSandboxCreate  = "sandbox.create"
	SpanSandboxStart   = "sandbox.start"
	SpanSandboxWait    = "sandbox.wait"
	SpanSandboxCollect = "sandbox.collect"
	SpanCacheLookup    = "cache.lookup"
	SpanCacheStore     = "cache.store"
)

// OpenTelemetry semantic-convention keys. Kiln uses them where they exist so
// that Jaeger and other back ends recognise the values without configuration.
const (
	ContainerImageNameKey = attribute.Key("container.image.name")
	OCIManifestDigestKey  = attribute.Key("oci.manifest.digest")
	ContainerIDKey        = attribute.Key("container.id")
	HostNameKey           = attribute.Key("host.name")
	ServiceNameKey        = attribute.Key("service.name")
	ServiceVersionKey     = attribute.Key("service.version")
)

// Kiln's own keys, under the kiln. prefix so they never collide with a
// future semantic convention.
const (
	JobIDKey          = attribute.Key("kiln.job.id")
	SessionIDKey      = attribute.Key("kiln.session.id")
	CallSeqKey        = attribute.Key("kiln.session.call") // the call's seq in its session
	CodeSHA256Key     = attribute.Key("kiln.code.sha256")  // the code itself is never traced
	CacheKeyKey       = attribute.Key("kiln.cache.key")
	CacheHitKey       = attribute.Key("kiln.cache.hit")
	RuntimeKey        = attribute.Key("kiln.runtime")
	AttemptKey        = attribute.Key("kiln.attempt")
	ExitCodeKey       = attribute.Key("kiln.exit_code")
	StatusKey         = attribute.Key("kiln.status")
	ErrorCategoryKey  = attribute.Key("kiln.error.category")
	CPUTimeMSKey      = attribute.Key("kiln.cpu_time_ms")
	MemoryPeakKey     = attribute.Key("kiln.memory.peak_bytes")
	OutputBytesKey    = attribute.Key("kiln.output.bytes")
	QueueWaitMSKey    = attribute.Key("kiln.queue.wait_ms")
	WorkerIDKey       = attribute.Key("kiln.worker.id")
	LimitTimeoutMSKey = attribute.Key("kiln.limits.timeout_ms")
	LimitMemoryMBKey  = attribute.Key("kiln.limits.memory_mb")
	LimitCPUMSKey     = attribute.Key("kiln.limits.cpu_ms")
	LimitPidsKey      = attribute.Key("kiln.limits.pids")
	LimitOutputKey    = attribute.Key("kiln.limits.output_bytes")
	LimitDiskMBKey    = attribute.Key("kiln.limits.disk_mb")
	// SandboxPooledKey says whether the job's sandbox was prepared before
	// the job arrived (the warm pool) rather than for it.
	SandboxPooledKey = attribute.Key("kiln.sandbox.pooled")
	// SandboxBoxKey says the job ran in a fresh inner sandbox of a box (a
	// long-lived container whose supervisor forks every job into fresh
	// namespaces).
	SandboxBoxKey = attribute.Key("kiln.sandbox.box")
	// BoxMeetKey says how a job met a box in the box metrics: "hit",
	// "claim" or "miss".
	BoxMeetKey = attribute.Key("kiln.box.meet")
	// BoxAheadKey says what became of an inner sandbox made ahead of its
	// job in the box metrics: "used" or "discarded".
	BoxAheadKey = attribute.Key("kiln.box.ahead")
)

// LimitAttrs returns one kiln.limits.* attribute per field of l. Pass the
// resolved limits (after job.Policy.Resolve) so the trace shows what the
// sandbox actually enforced, not what the client asked for.
func LimitAttrs(l job.Limits) []attribute.KeyValue {
	return []attribute.KeyValue{
		LimitTimeoutMSKey.Int64(l.TimeoutMS),
		LimitMemoryMBKey.Int64(l.MemoryMB),
		LimitCPUMSKey.Int64(l.CPUMS),
		LimitPidsKey.Int64(l.Pids),
		LimitOutputKey.Int64(l.OutputBytes),
		LimitDiskMBKey.Int64(l.DiskMB),
	}
}
