// Package egresstest is the far side of a job's egress in tests and in
// `make bench`: an HTTPS server and a plain HTTP server on loopback that
// answer for chosen host names, with a certificate authority of their own
// that a job is told to trust (SSL_CERT_FILE and friends).
//
// Seam: a worker reaches these servers only through its test-only name
// table (`--egress-test-hosts`, egress.TestHosts), which maps the names to
// the servers' loopback addresses; nothing a test does resolves a name
// through DNS or leaves the machine.
//
// Invariants: the servers answer only /hello, /bytes?n= and /redirect?to=;
// the authority and the certificate are made fresh for each server.
package egresstest
