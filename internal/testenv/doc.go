// Package testenv starts the real services Kiln's integration tests talk to:
// a redis-server process (alone, as a replicated pair, or behind Sentinel),
// an embedded NATS JetStream server or a cluster of nats-server processes,
// and a check for a containerd socket.
//
// Seam: Start* functions take the test and clean up with it; tests get
// addresses and handles, never a mock. WaitDrained and SubmitRetrying are
// the waits several suites share on those services.
//
// Invariants: every server is private to its test (a free port and a
// temporary directory); under KILN_INTEGRATION=require a missing dependency
// fails the test instead of skipping it (Unavailable).
package testenv
