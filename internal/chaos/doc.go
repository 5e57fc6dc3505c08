// Package chaos tests the fleet under faults that last a length of time:
// it holds tests only.
//
// Seam: in chaos_test.go the test binary re-runs itself as the API or the
// NATS server (a role in KILN_CHAOS_ROLE) so the test can kill, stop and
// restart them while clients submit; outage_test.go stops an embedded NATS
// server (same store directory across the restart) or Redis under an
// in-process API and workers on a scripted runtime (those tests are about
// the queue, the leases and the store, not containerd). The containerd test
// starts a containerd of its own (deploy/local/containerd.sh on a temporary
// root, state dir and socket; privatecontainerd_test.go), copies the image
// into it from the shared containerd, and runs the API and real workers in
// process against it (fleet_test.go), so it can kill containerd without
// touching the one other packages' tests use. Redis and NATS come from
// internal/testenv.
//
// Invariants it checks: under faults, an idempotent client's submissions
// are neither lost nor run twice; jobs held while NATS or Redis is down
// finish once it is back, and a redelivery that meets a live lease waits
// instead of running the job again; a containerd outage ends no job as
// internal_error, runs none twice, spends no delivery, and the workers say
// they are not ready while it lasts.
package chaos
