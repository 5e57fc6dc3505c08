// Package sandboxapi is the contract between the worker and its sandbox
// backend, as plain types both sides import: the explicit request one run
// (or one session call) is made of, the Network seam a job's network
// namespace is served through, and a session's box as an interface.
//
// Seam: package worker declares the one interface it calls its backend
// through (worker.Sandboxes) in terms of these types; package sandbox's
// Containerd implements it; worker/egress's proxy is the Network a worker
// gives its jobs (worker/egress.go). Nothing here is carried in a context.
//
// Invariants: the zero Request's callbacks do nothing (no live output, no
// artifact collected, no network); a nil Network is NoNetwork, and a job
// with a network is then refused before anything of it is made; a backend
// that cannot do an optional part says so with an error wrapping
// errors.ErrUnsupported, never by not implementing the method. The package
// imports nothing of Kiln but job.
package sandboxapi
