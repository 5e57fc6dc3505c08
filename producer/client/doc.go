// Package client is the Go client of Kiln's HTTP API: submit jobs (one or a
// batch), read and long-poll them, wait for their results, follow their
// live events, download artifacts, cancel them, list runtimes, and use
// budgets, replay, the audit log and sessions.
//
// Seam: it speaks HTTP only and shares the wire types of package job; it
// imports nothing of the server.
//
// Invariants: a submission is retried under one Idempotency-Key, so a retry
// never makes a second job; 429 and 503 are retried honouring Retry-After;
// Wait outlasts API restarts and ends with its context. API errors are
// *Error values carrying the RFC 9457 problem the server sent, and each
// problem type is an errors.Is sentinel (ErrQueueFull and kin), so callers
// branch without parsing text.
package client
