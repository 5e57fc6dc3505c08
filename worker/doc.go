// Package worker is Kiln's JetStream consumer loop. A worker pulls a job only
// when it has a free slot, taking tenants in turn (fairshare.go), runs it
// through its sandbox backend, keeps the message alive with InProgress heartbeats and
// the job record's lease while it runs, writes the result to the store
// (first terminal write wins), answers waiters on kiln.done.<id>, and decides
// ack / nak / term in one place (decide.go). It drains on shutdown, holds
// its worker id under a lease, and reaps sandboxes left behind by a crashed
// predecessor or a dead worker.
//
// Each delivery is one object carried from claim to ack (delivery.go): it
// marks its job running under its lease (lease.go), makes its run's
// request and runs it. A run reserves its tenant's CPU quota (cpuquota.go)
// and holds its budget (budget.go) as it starts; the recorder (record.go)
// settles both as it records the result, durably (durable.go); output past
// the inline bound and artifacts go to the object store within the
// tenant's stored bounds (objectStore: objects.go, spill.go, storequota.go);
// a replay notes how it compares with its original (replay.go); the result
// is appended to the tenant's audit log (auditLog, audit.go) and its
// callback queued before the ack.
//
// Worker is the hub: Run starts, and drains, parts that each own their
// state, made in New: storeWatch (storewatch.go: the store's retries and
// the pause on pulls while it is down), backendState (backend.go: the
// sandbox backend's health), ownership (ownership.go: the worker id's lease,
// reaping), registrar (registry.go: the runtime registry), advisories
// (advisory.go: jobs whose deliveries ran out), cancels (cancel.go: what
// runs here, for cancels by request), writeProbes (writeprobe.go),
// egressProxies (egress.go), recorder, objectStore and auditLog. The
// readiness checks they set are ready.go's; the pull in fair turns is
// fairshare.go's.
// Sessions (session.go, session_files.go): the worker holds a session's box,
// runs its calls one at a time in order, checkpoints its files after each,
// and brings back a session whose worker was lost.
//
// Seam: the sandbox backend is one interface, Sandboxes (deps.go;
// package sandbox's Containerd implements it): a run is an explicit
// internal/sandboxapi Request (id, spec, tenant, output sink, artifact
// store, Network), a session's box a sandboxapi.Session, and what a backend
// cannot do it answers as unsupported; the worker imports no sandbox
// implementation. A job's network is the Network egress.go serves with
// worker/egress's proxy. The store is the Store interface (package cache
// implements it). Tests drive the loop with fake backends
// (testkit.Runtime) and real Redis and JetStream.
//
// Invariants: nothing a job wrote leaves the worker unredacted (redact.go:
// stdout, stderr, the error, artifact names, live output, log lines); a
// panic while a job is handled fails only that job's attempt; a delivery
// whose job's lease is live elsewhere is held, never run beside it; a job
// whose deliveries run out is recorded internal_error and terminated, never
// left queued or running; while Redis or containerd is unavailable no new
// job is pulled; the package never imports the producer.
package worker
