// Package job holds Kiln's wire contract: job specs, limits, results, statuses,
// error categories, the canonical cache key, NATS subject and header names, and
// the sessions' wire types (session.go).
// It is a leaf package: it imports nothing of Kiln's and does no I/O.
package job
