// Package e2e holds Kiln's end-to-end tests: the HTTP API, NATS JetStream,
// workers, Redis and the containerd sandbox, all real, wired as in
// production; it holds tests only. The SDK suites (Python, TypeScript) and
// the MCP clients run against it too.
//
// Seam: the packages are wired in process as cmd/kiln wires them, or the
// kiln binary is started as a child process where a test needs one to die.
//
// Invariants it checks: what a user would notice through the API (results,
// artifacts, live events, callbacks, redaction, quotas, fair share, replay,
// the audit log, sessions) holds with every real dependency in the path.
package e2e
