// Package producer is Kiln's HTTP API: it validates job specs, answers from
// the Redis result cache when it can, records new jobs in Redis and publishes
// them to the NATS JetStream work queue with the job id as Nats-Msg-Id and the
// W3C trace context in the message headers. It also answers polls and
// long-polls (woken by the workers' kiln.done.<id> notices, never by polling
// Redis), cancellations, batches, the runtime list, health and readiness, and
// serves its own OpenAPI 3.1 description at /openapi.json.
//
// Identical submissions that may be cached are coalesced: while one job with a
// given cache key is queued or running, N identical submissions are all
// answered with that job, so they cause one execution.
//
// Production controls: execution budgets (budgets.go: POST/GET
// /v1/budgets, a run held from acceptance, refused with budget-exhausted),
// replay by id on the same image digest (replay.go), and each tenant's
// audit log, appended here and by workers and read at GET /v1/audit
// (audit.go). A tenant's redaction policy rides on each job's message;
// workers apply it.
//
// Errors are RFC 9457 problem documents (application/problem+json) whose
// detail says what to change. The Go client lives in producer/client.
//
// Sessions (sessions.go) keep one sandbox's interpreter and /work between
// calls: the API keeps their catalog in the store, asks the fleet for a
// session's sandbox over NATS, and accepts calls into the catalog in order.
package producer
