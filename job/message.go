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
	// Tenant is the name of the API key that submitted the job; its
	// callback is signed with that tenant's secret.
	Tenant string `json:"tenant,omitempty"`
}

// RuntimeInfo describes one runtime a worker fleet offers (GET /v1/runtimes).
type RuntimeInfo struct {
	Name   string `json:"name"`
	Image  string `json:"image"`
	Digest string `json:"digest"`
	Limits Policy `json:"limits"`
}
