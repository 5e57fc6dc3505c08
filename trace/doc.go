// Package trace sets up Kiln's OpenTelemetry plumbing: tracer and meter
// providers configured from the standard OTEL_* environment, the OTLP span
// exporter behind a bounded batch processor, the W3C trace-context carrier for
// NATS headers, the span and attribute names every hop uses (attrs.go), the
// kiln_* Prometheus instruments, and a slog handler that stamps log lines with
// the active trace and span ids.
//
// A job is one trace: the API's submit span, the queue wait, the worker's
// execute span and the sandbox steps below it. The context crosses NATS in the
// message headers (see Inject and Extract), so the worker's spans are children
// of the API's even though they run in another process.
//
// Seam: callers get Providers from Setup and pass them on; they import this
// package as ktrace to keep it apart from go.opentelemetry.io/otel/trace.
//
// Invariants: no business logic; no globals unless asked
// (Providers.SetGlobal); a slow or absent collector drops spans, never stalls
// a job; code, inputs and output never go into spans, only hashes and sizes;
// exported spans pass through the redactor's built-in detectors (redact.go).
package trace
