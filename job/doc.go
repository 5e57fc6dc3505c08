// Package job holds Kiln's wire contract: job specs, limits, results, statuses,
// error categories, the canonical cache key, and NATS subject and header names.
// It is a leaf package: it imports nothing of Kiln's and does no I/O.
package job
