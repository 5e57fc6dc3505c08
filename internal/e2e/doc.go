// Package e2e holds Kiln's end-to-end tests: the HTTP API, NATS JetStream,
// workers, Redis and the containerd sandbox, all real, wired as in production.
package e2e
