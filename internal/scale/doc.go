// Package scale tests the queue as a platform with many tenants uses it:
// it holds tests only. The API and workers run in process on a scripted
// runtime (the tests are about the queue, fair turns and bounds, not
// containerd), against a real NATS JetStream server and redis-server from
// internal/testenv.
//
// Invariants it checks: the queue's JetStream footprint (streams and
// consumers) does not grow with the number of tenants; every submission of
// thousands of tenants is accepted and runs once; a tenant with thousands of
// jobs queued delays another tenant's job by about one job per slot; a
// tenant's max_running holds across workers.
package scale
