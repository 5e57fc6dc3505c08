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
// Delivery is at least once: a receiver should treat Kiln-Job-Id as an
// idempotency key.
//
// Tenants: each tenant's callbacks wait on a subject and durable consumer of
// their own (job.TenantCallbackSubject), and a deliverer sends at most
// Config.TenantConcurrency of one tenant's at once, so a tenant whose
// receiver hangs, or who has thousands of callbacks waiting, delays only
// its own.
//
// Signature: the header Kiln-Signature is "t=<unix seconds>,v1=<hex>", where
// hex is HMAC-SHA256(secret, "<t>.<body>"). Verify checks it.
//
// Addresses: the Guard refuses loopback, private, link-local, shared,
// multicast, documentation and other non-public addresses unless the server
// allows their networks. It is checked when the job is submitted, and again
// on every connection against the address actually dialed, so a host name
// that resolves elsewhere later (DNS rebinding) gains nothing. Redirects are
// never followed, and no HTTP proxy is used.
package callback
