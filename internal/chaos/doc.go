// Package chaos tests the submission path with the API and NATS as real
// processes that the test kills, stops and restarts while clients submit;
// it holds tests only.
//
// Seam: the test binary re-runs itself as the API or the NATS server (a
// role in KILN_CHAOS_ROLE); a worker runs in the test's own process, and
// Redis comes from internal/testenv.
//
// Invariants it checks: under faults, an idempotent client's submissions
// are neither lost nor run twice.
package chaos
