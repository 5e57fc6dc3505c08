// Package events owns the KILN_EVENTS stream that retains jobs' live events
// (status changes, output chunks, the artifact list, the end marker), the
// publishing side used by workers and producers, and the coalescing of a
// job's output into a bounded rate of messages (output.go).
//
// Seam: Ensure defines the stream; Publish, Status, End and Output publish
// on kiln.events.<id>; the producer's SSE handler reads the stream.
//
// Invariants: nothing here touches Redis; live output is capped at the
// job's output limit like the stored output, and redacted before it is
// published when a Detector is given.
package events
