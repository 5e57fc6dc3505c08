// Package queue owns the JetStream streams and consumers that the producer
// and the worker share, so neither has to import the other: the job stream
// KILN_JOBS, where each tenant's jobs wait on a subject of their own with no
// consumer (queue.go, tenant.go); the ready stream KILN_READY and each
// runtime's consumers of it, one per shard, shared by the fleet (ready.go);
// the fair-share Picker that takes a runtime's tenants in turn and moves each
// one's next job to the ready stream (picker.go); the callback stream
// (callbacks.go), the store probe (writeprobe.go) and the server version
// check (version.go). See docs/decisions/queue.md.
//
// Seam: functions over a jetstream.JetStream; subject names come from
// package job.
//
// Invariants: nothing in NATS is made per tenant (two streams and runtimes ×
// shards consumers, whatever the number of tenants); a tenant's jobs out of
// its backlog at once (ready or running) are at most its max_running, held by
// the ready stream's one message per subject; a job moved twice is stored
// once. Each definition has one owner that applies it; everyone else
// verifies (owner.go): the API owns KILN_JOBS (its bounds are the API's
// backpressure), the worker fleet owns KILN_READY and its consumers, applied
// by the first worker to start and updated only by a worker started as the
// queue owner. A process whose settings differ from the server's logs the
// difference at ERROR and keeps the server's.
package queue
