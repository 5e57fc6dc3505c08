// Package blob owns the JetStream Object Store bucket (KILN_BLOBS) that
// holds a job's stored content: artifacts, output streams past the inline
// bound, and inputs too large for one NATS message.
//
// Seam: the producer and the worker both open it through Ensure, so the
// bucket is defined in one place; *Store is what they read and write.
//
// Invariants: objects are content-addressed (job.ObjectName: tenant +
// SHA-256), so the same file written by many jobs of one tenant is stored
// once and nothing is shared across tenants; reads check the digest. The
// bucket's TTL is the retention of everything that can point at an object
// (job records and result-cache entries).
package blob
