// Package producer is Kiln's HTTP API: it validates job specs, answers from
// the Redis result cache when it can, records new jobs in Redis and publishes
// them to the NATS JetStream work queue with the job id as Nats-Msg-Id and the
// W3C trace context in the message headers. It also answers polls and
// long-polls (woken by the workers' kiln.done.<id> notices, never by polling
// Redis), cancellations, batches, live events over SSE, artifacts, the
// runtime list, tool definitions and tool calls, listings of a tenant's jobs
// (joblisting.go, over cache's job index) and sessions, health and readiness,
// a read-only run page for people (ui.go, ui_run.go: server-rendered HTML of
// the same records, embedded templates), and serves its own OpenAPI 3.1
// description at /openapi.json, the API's only reference.
//
// A submission is one domain call, submit (submission.go), whatever route it
// came by (POST /v1/jobs, batches, replays, tool calls): idempotency, the
// result cache, budget, record, coalescing, publish and the audit record.
// It returns the sentinel errors of errors.go, never an HTTP answer; one
// function, toProblem (problem.go), maps every error to the problem a route
// answers (status, type, Retry-After). The tenant of a request is its API
// key's name, or job.DefaultTenant without keys; a job's is
// Message.TenantOrDefault.
//
// Identical submissions that may be cached are coalesced: while one job with a
// given cache key is queued or running, identical submissions of the same
// tenant are answered with that job, so they cause one execution. A cache
// hit of an entry the API has read before costs one Redis round trip, which
// also checks that the entry is still the one in Redis, and its answer is
// made from the entry's template (cachehit.go).
//
// Production controls: execution budgets (budgets.go), replay by id on the
// same image digest (replay.go), and each tenant's audit log, appended here
// and by workers and read at GET /v1/audit (audit.go). A tenant's redaction
// policy and quota ride on each job's message; workers apply them. Sessions
// (sessions*.go) keep one box's interpreter and /work between calls: the API
// keeps their catalog in the store, asks the fleet for a session's box over
// NATS, and accepts calls into the catalog in order.
//
// Structure: Server wires the API's parts together in New and owns their
// background loops; each part is a type that owns its state and the
// methods over it: jobQueue (the job stream's set-up and state,
// publishing, the queue gauges: publish.go, stream.go, queuedepth.go),
// storeProbes (writeprobe.go), auditLog (audit.go), waits (long-polls,
// wait.go), eventStreams (SSE, with the gate bounding open streams:
// events.go, eventfollow.go, streamgate.go), submissions (submission.go,
// cachehit.go), sessions (sessions*.go), budgets (budgets.go), tenants
// (tenant.go, quota.go, network.go, callback.go), resultWriter
// (resultwrite.go), tenantMetrics (tenant.go), apiKeys (auth.go) and
// problems (problem.go). Most routes are grouped by resource into route
// types holding the parts they use (the event stream, budgets and the audit
// log are served by their parts, eventStreams, budgets and auditLog, which
// hold all those routes use): jobRoutes (jobs.go and the job routes' files), toolRoutes
// (toolcall*.go, tools.go), sessionRoutes (sessions and their calls),
// callRoutes, commandRoutes and fileRoutes (a session's calls, commands and
// files), healthRoutes (health.go) and
// uiRoutes (ui.go, ui_run.go); routes (server.go) maps them.
//
// Seam: the store is an interface (Store, BudgetStore, SessionStore),
// implemented by package cache; the queue is JetStream, with definitions
// from internal/queue; the Go client lives in producer/client.
//
// Invariants: every request body is scanned for repeated and wrongly-cased
// keys before it is decoded, and bounded alone and in flight; a job of
// another tenant is answered as an unknown one; no job is left recorded as
// queued that was never published (the record is removed, or republished by
// the reconciler); errors are problem documents naming the field; the
// package never imports the worker.
package producer
