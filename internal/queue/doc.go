// Package queue owns the JetStream streams and consumers that the producer
// and the worker share, so neither has to import the other: the job stream
// KILN_JOBS and each runtime's and tenant's consumers (queue.go, tenant.go),
// the callback stream (callbacks.go), the store probe (writeprobe.go), the
// server version check (version.go), and the fair-share Picker that takes a
// runtime's tenants in turn (picker.go).
//
// Seam: functions over a jetstream.JetStream; subject names come from
// package job.
//
// Invariants: each definition has one owner that applies it; everyone else
// verifies (owner.go). The API owns the stream KILN_JOBS (its queue bounds
// are the API's backpressure); the worker fleet owns the consumers, applied
// by the first worker to start and updated only by a worker started as the
// queue owner. A process whose settings differ from the server's logs the
// difference at ERROR and keeps the server's. A tenant's consumer's
// MaxAckPending is its max_running.
package queue
