// Package chaos tests the fleet under faults that real processes suffer:
// the API and NATS killed, stopped and restarted while clients submit, and
// containerd SIGKILLed for 30 s under load; it holds tests only.
//
// Seam: the test binary re-runs itself as the API or the NATS server (a
// role in KILN_CHAOS_ROLE), and a worker runs in the test's own process;
// Redis comes from internal/testenv. The containerd test starts a
// containerd of its own (deploy/local/containerd.sh on a temporary root,
// state dir and socket; privatecontainerd_test.go), copies the image into
// it from the shared containerd, and runs the API and real workers in
// process against it (fleet_test.go), so it can kill containerd without
// touching the one other packages' tests use.
//
// Invariants it checks: under faults, an idempotent client's submissions
// are neither lost nor run twice; a containerd outage ends no job as
// internal_error, runs none twice, spends no delivery, and the workers say
// they are not ready while it lasts.
package chaos
