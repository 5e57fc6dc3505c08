// Package localnet holds the two loopback helpers that the test environment
// and the benchmark both need to run private servers: a free port, and a
// dependency-free Redis PING to wait for a server to come up. A free port
// is drawn below the kernel's ephemeral range, so the outgoing connections
// of a busy host cannot take it before the server binds it.
//
// Seam: plain functions (FreePort, RedisPing), no state.
//
// Invariants: loopback only; it never touches a server it did not start.
package localnet
