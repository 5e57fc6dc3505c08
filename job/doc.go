// Package job is Kiln's wire contract: job specs, limits and the limit
// policy, results, statuses, error categories, RFC 9457 problem types, the
// canonical cache key, job ids, every NATS payload (job message, completion
// notice, cancel, live events, callbacks, audit records), subject and header
// names, and the sessions' wire types (session.go); the egress allowlist
// grammar is its subpackage egressrule.
//
// Seam: every other package speaks to every other through these types, so
// the producer and the worker never import each other. A change here is a
// change of the API, the queue's messages or the stored records.
//
// Invariants: a leaf (it imports nothing of Kiln's) that does no I/O. A
// terminal status is final. The cache key (key.go) covers everything that
// can change a job's outcome, the image digest included, and is versioned.
// Failures carry a category and whether a retry can help, so callers never
// parse text.
package job
