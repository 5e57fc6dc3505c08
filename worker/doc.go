// Package worker is Kiln's JetStream consumer loop. A worker pulls a job only
// when it has a free slot, runs it through a sandbox.Runtime, keeps the message
// alive with InProgress heartbeats while it runs, writes the result to the
// store (first terminal write wins), answers waiters on kiln.done.<id>, and
// decides ack / nak / term in one place (outcome.go). It drains on shutdown
// and reaps containers left behind by a crashed predecessor.
//
// Nothing a job wrote leaves the worker unredacted (redact.go): stdout,
// stderr, the error message and artifact names before the result is
// stored, live output chunk by chunk, and the worker's own log lines. A run
// holds its budget as it starts and charges it as its result is recorded
// (budget.go), notes how a replay compares with its original (replay.go),
// and appends its result to the tenant's audit log (audit.go).
//
// It also holds sessions (session.go): it takes a session's sandbox when it
// has room, runs the session's calls one at a time in order, checkpoints its
// files after each, and brings back a session whose worker was lost.
package worker
