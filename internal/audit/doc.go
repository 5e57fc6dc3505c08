// Package audit keeps tenants' audit logs in the KILN_AUDIT JetStream
// stream: the API and the workers append records (submissions, results,
// cancels, budgets, replays), and the API reads a tenant's records back in
// order.
//
// Seam: Ensure defines the stream; Append (or Msg) writes one
// job.AuditRecord on the tenant's subject, with a message id when it must be
// kept once; BatchMsgs writes several of one kind in a message (JSON lines,
// FormatHeader); Read serves GET /v1/audit from both kinds of message;
// Admit counts what a tenant appends against its daily bounds (Bound,
// kept in Redis by a Counter) before the API and the workers append it.
//
// Invariants: file storage, so the log outlives API, worker and NATS
// restarts; records age out after the configured retention; a tenant adds
// at most its bounds a day, and reaching them is itself one record; a tenant reads
// only its own; every record read has its own Seq, in the log's order; a
// record names the key that acted by a fingerprint (KeyID), never the key,
// and content by its SHA-256, never the content.
package audit
