// Package audit keeps tenants' audit logs in the KILN_AUDIT JetStream
// stream: the API and the workers append records (submissions, results,
// cancels, budgets, replays), and the API reads a tenant's records back in
// order.
//
// Seam: Ensure defines the stream; Append (or Msg) writes a job.AuditRecord
// on the tenant's subject; Read serves GET /v1/audit.
//
// Invariants: file storage, so the log outlives API, worker and NATS
// restarts; records age out after the configured retention; a tenant reads
// only its own; a record names the key that acted by a fingerprint
// (KeyID), never the key, and content by its SHA-256, never the content.
package audit
