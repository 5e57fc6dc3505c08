package job

import "time"

// Message is what a producer publishes to JetStream for one job, and what
// the job record in Redis holds besides its Result.
type Message struct {
	ID        string    `json:"id"`
	Spec      Spec      `json:"spec"` // limits resolved, runtime set
	Key       string    `json:"key"`  // cache key computed with the digest the producer saw
	CreatedAt time.Time `json:"created_at"`
	TraceID   string    `json:"trace_id,omitempty"`
	// Tenant is the name of the API key that submitted the job ("default"
	// in dev mode). Only that tenant can see the job; its callback is signed
	// with that tenant's secret.
	Tenant string `json:"tenant,omitempty"`
	// CacheScope is the result-cache scope the job's Key was computed in:
	// the tenant, or the cache group it shares a cache with (see ScopedKey).
	CacheScope string `json:"cache_scope,omitempty"`
	// Quota is what the worker enforces for the tenant while running the
	// job (its API key's settings when the job was queued); nil: nothing.
	Quota *TenantQuota `json:"quota,omitempty"`
	// Redact is how the worker redacts the job's output (the tenant's key-file
	// settings when the job was queued); nil: the default, RedactOn.
	Redact *RedactPolicy `json:"redact,omitempty"`
	// ReplayOf is the job this one replays: the worker compares the two
	// results (Result.Replay).
	ReplayOf string `json:"replay_of,omitempty"`
	// SpecRef, when set, holds the whole Spec in the object store (a spec
	// too large for one NATS message); Spec then keeps only runtime, limits
	// and the cache flag.
	SpecRef *ObjectRef `json:"spec_ref,omitempty"`
}

// RuntimeInfo describes one runtime a worker fleet offers (GET /v1/runtimes).
// The fields after Limits come from the runtime's profile and its image
// (see RuntimeContract); a worker that does not know them leaves them empty.
type RuntimeInfo struct {
	Name   string `json:"name"`
	Image  string `json:"image"`
	Digest string `json:"digest"`
	Limits Policy `json:"limits"`
	RuntimeContract
}
