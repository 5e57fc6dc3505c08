// Package redact finds key-like strings in a job's output and replaces them
// with [REDACTED:<kind>] before the output leaves the worker: built-in
// detectors for common credential formats (cloud access keys, VCS tokens,
// chat, payment and LLM-vendor API keys, JWTs, PEM private keys,
// Authorization values, passwords in URLs), plus the secrets and patterns a
// tenant registers, and in strict mode assignments of secret-named settings.
//
// Seam: a Detector redacts a whole buffer, a string or a JSON value's
// strings; Detector.Result redacts every string of a job.Result, found by
// reflection (result.go: a new field is covered without being listed); a
// Stream redacts live output chunk by chunk. The worker, the live-event
// publisher and the trace exporter call them.
//
// Invariants: a Stream holds back a short tail, and any key still growing,
// so a key split across two chunks is still caught. The built-in detectors
// are hand-written matchers, not regular expressions: they run on every
// output byte, so the scan looks only at bytes that can start a key (a
// 256-entry table) at the start of a token. A tenant's registered secret
// travels as its length and hashes, never as itself. A leaf: it imports only
// job.
package redact
