// Package cache is Kiln's Redis layer, the system of record for job state:
// job records with a retention TTL, leases on running jobs and on worker
// ids, the result cache addressed by job.Key, coalescing of identical
// in-flight jobs, Idempotency-Key claims, the runtime registry that workers
// publish and producers read, tenants' quotas and CPU reservations, budgets,
// stored-content counts, callback state, the sessions' catalog
// (sessions.go) and each tenant's job index, which lists its jobs a page at
// a time by status, creation time and metadata (jobindex.go). Results are
// stored as compact frames (resultcodec.go), and Sentinel and replica
// waits are handled here (sentinel.go, replicated.go).
// The API's cache hits of an entry it has read before are checked against
// Redis and recorded in one round trip: a transaction that reads the entry
// and writes the record (a script for an id an Idempotency-Key names), the
// hits of concurrent submissions sent as one pipeline holding one
// transaction (known.go, hittx.go, batch.go).
//
// Structure: a Store is its parts, each the store of one concern over the
// one connection they share (store.go): Jobs (job records, their leases,
// listing, publish and callback state), Results (the result cache and the
// records of its hits), Claims (Idempotency-Key and in-flight claims),
// Sessions (the sessions' catalog), Budgets, Quotas (submission rate, CPU,
// stored bytes, audit records) and Fleet (the runtime registry, worker-id
// leases). Each owns its keys, scripts and logic and works alone; their
// methods are the Store's. A change that spans two concerns is still one
// step, made by one part: Jobs' scripts release the in-flight claims
// Claims makes, and Results writes the records of cache hits, entering
// them in the job index as Jobs does its own (jobindex.go's jobIndex).
//
// Seam: *Store is the one implementation of the producer's and the worker's
// store interfaces; tests run it against a real redis-server.
//
// Invariants: every state change that reads before it writes (CreateJob,
// MarkRunningLeased, Finish, Cancel, DeleteJob, ReleaseInflight, the runtime
// registry, reservations) is one Lua script, held in scripts.go or in the
// file of its concern: atomic on the server and one round trip. (A cache
// hit under an id no one else knows yet is the exception: its transaction
// writes the record and reads the entry, and the record is removed, its id
// never answered, when the entry read is not the one remembered;
// hittx.go.) A terminal record never changes again, the first terminal
// result wins, and a record keeps the TTL it was created with. A job's
// place in its tenant's job index changes in the same script as its
// status, and the index keeps no job longer than its record's retention.
// Every Redis key is built in keys.go (the sessions' catalog's in
// sessions.go, budgets' in budget.go). Every error caused by Redis being
// unreachable, slow or closed wraps ErrUnavailable, so an API can answer
// 503 with errors.Is(err, cache.ErrUnavailable). The package knows nothing
// of HTTP or NATS.
package cache
