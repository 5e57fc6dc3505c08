// Package cache is Kiln's Redis layer: job records with a retention TTL, the
// result cache addressed by job.Key, coalescing of identical in-flight jobs,
// Idempotency-Key claims, and the runtime registry that workers publish and
// producers read.
//
// Every state change that reads before it writes (CreateJob, MarkRunning,
// Finish, Cancel, DeleteJob, ReleaseInflight, the runtime registry) is one Lua
// script: atomic on the server and one round trip. The rules they enforce are
// the job contract's: a terminal record never changes again, the first
// terminal result wins, and a record keeps the TTL it was created with.
//
// Every Redis key is built in keys.go (the sessions' catalog in sessions.go). Every error caused by Redis being
// unreachable, slow or closed wraps ErrUnavailable, so an API can answer 503
// with errors.Is(err, cache.ErrUnavailable).
//
// The package knows nothing of HTTP or NATS.
package cache
