// Package resultio writes job Results whose output streams are kept in the
// object store (job.Result.StdoutObject/StderrObject).
//
// Seam: Write streams such a Result's JSON to a client, reading each stream
// through an Opener as it goes; Load reads the streams back into the Result
// for the few readers that need it whole.
//
// Invariants: a Result's output is never built in memory to answer a
// request; the bytes written are those stored, escaped as JSON on the fly; a
// failure after the first byte is returned to the caller, which aborts the
// answer rather than cutting it short silently.
package resultio
