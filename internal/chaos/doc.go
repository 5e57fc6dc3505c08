// Package chaos tests the fleet under faults that last a length of time:
// it holds tests only.
//
// Seam: in chaos_test.go the test binary re-runs itself as the API or the
// NATS server (a role in KILN_CHAOS_ROLE) so the test can kill, stop and
// restart them while clients submit; outage_test.go stops an embedded NATS
// server (same store directory across the restart) or Redis under an
// in-process API and workers. Workers run in the test's own process on a
// scripted runtime (these tests are about the queue, the leases and the
// store, not containerd); Redis and NATS come from internal/testenv.
//
// Invariants it checks: under faults, an idempotent client's submissions
// are neither lost nor run twice; jobs held while NATS or Redis is down
// finish once it is back, and a redelivery that meets a live lease waits
// instead of running the job again.
package chaos
