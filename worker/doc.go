// Package worker is Kiln's JetStream consumer loop. A worker pulls a job only
// when it has a free slot, runs it through a sandbox.Runtime, keeps the message
// alive with InProgress heartbeats while it runs, writes the result to the
// store (first terminal write wins), answers waiters on kiln.done.<id>, and
// decides ack / nak / term in one place (outcome.go). It drains on shutdown
// and reaps containers left behind by a crashed predecessor.
//
// It also holds sessions (session.go): it takes a session's sandbox when it
// has room, runs the session's calls one at a time in order, checkpoints its
// files after each, and brings back a session whose worker was lost.
package worker
