// Package e2bapi serves E2B's wire format on the API's own address, so
// code written for E2B's SDKs runs on Kiln with E2B_API_URL and
// E2B_SANDBOX_URL both set to the API's URL (docs/e2b.md).
//
// It is a thin layer over the domain calls the native API makes
// (producer.Domain: a Server's session calls): an E2B sandbox is a Kiln
// session, runCode is a session call, the sandbox's files are the
// session's /work, a command (envd's process service) is a background
// command of the session. It keeps nothing of its own, so tenants, quotas,
// budgets, redaction, audit and tracing hold as they do on /v1.
//
// Control-plane requests (POST /sandboxes, GET /v2/sandboxes, ...) carry a
// Kiln API key in X-API-Key. Data-plane requests carry the headers
// E2b-Sandbox-Id and E2b-Sandbox-Port (49999: the code interpreter; 49983:
// envd) and the sandbox's access token (X-Access-Token or
// E2B-Traffic-Access-Token), which the API made from the creating key
// (producer.Domain.SessionToken) and hands out on create and connect.
package e2bapi
