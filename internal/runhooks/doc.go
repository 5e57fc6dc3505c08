// Package runhooks carries the per-run callbacks of one sandbox run in its
// context (as net/http/httptrace carries a ClientTrace): live output, the
// storage of collected artifacts, and the job's tenant.
//
// Seam: the worker attaches Hooks with With; the sandbox reads them with
// From. The Runtime interface stays as it is for callers that want none of
// them.
//
// Invariants: the zero Hooks does nothing; Output must not block, since it
// runs on the output copy path; without Store no artifact is collected.
package runhooks
