// Package callback tells a job's submitter that the job ended: it POSTs the
// job's Result to the job's callback_url, signed with the tenant's secret.
//
// Delivery is durable. A worker that records a job's terminal result
// publishes a job.CallbackRequest to the KILN_CALLBACKS JetStream stream
// before it acks the job, and a Deliverer (run by `kiln api`) consumes that
// stream: an attempt that times out, cannot connect or gets a 5xx (or 408,
// 429) answer is retried with exponential back-off until MaxAge after the job
// ended; a 2xx answer delivers; any other answer, or an address the Guard
// refuses, fails for good. A process that dies mid-delivery leaves the
// message unacked, and JetStream hands it to another deliverer. Every attempt
// is recorded on the job (GET /v1/jobs/{id} → "callback").
//
// Signature: the header Kiln-Signature is "t=<unix seconds>,v1=<hex>", where
// hex is HMAC-SHA256(secret, "<t>.<body>"). Verify checks it.
//
// Seam: the worker publishes job.CallbackRequest messages on the tenant's
// subject (the wire types are package job's); `kiln api` runs the
// Deliverer and hands the producer a Policy whose Guard checks a
// callback_url at submission. Non-public addresses come from
// internal/netguard.
//
// Invariants: delivery is at least once (a receiver should treat
// Kiln-Job-Id as an idempotency key). Each tenant's callbacks are published
// on a subject of their own (job.TenantCallbackSubject) and delivered
// through one durable consumer shared by every tenant, so JetStream holds
// the same consumers for one tenant or ten thousand. A deliverer sends at
// most Config.TenantConcurrency of one tenant's at once, and at most
// Config.DestinationConcurrency to one destination (scheme, host, port)
// whatever their tenants; a callback that finds its tenant's or its
// destination's slots busy is parked on a subject of its tenant and
// destination, which no consumer reads, and moved back as both have a slot
// free, so a receiver that hangs delays only the callbacks sent to it,
// however many there are, and not the same tenant's to others. Loopback, private,
// link-local and other non-public addresses are refused unless the server
// allows their networks, at submission and again on every connection
// against the address actually dialed, so DNS rebinding gains nothing;
// redirects are never followed and no HTTP proxy is used.
package callback
