// Package egress is a job's way out: an HTTP proxy (CONNECT for TLS, plain
// HTTP in absolute form) that the worker runs for one job that asked for a
// network, served on a listener inside the job's own loopback-only network
// namespace (sandbox makes it; the worker serves it as the run's
// sandboxapi.Network, worker/egress.go).
//
// It enforces an allowlist (package job/egressrule's Rules: names and "*."
// suffixes, with ports; a job's rules must stay Within its tenant's — the
// producer checks that at submission) with the checks of every connection: the name asked for
// against the allowlist; the name resolved by the proxy itself and refused
// when any address is not public unicast (netguard), after resolution, so
// DNS rebinding and metadata addresses fail; a tunnel's TLS ClientHello must
// name the host the tunnel was asked for; per-job caps on connections,
// bytes and time. A refused request gets a plain-text HTTP error the
// program can read. Every connection leaves a Record (job.EgressRecord:
// name, address, bytes each way, duration, allowed or why not); Egress sums
// them for the job's result.
//
// Seam: Config takes the Resolver and the Dial function, and TestHosts (the
// test-only name table of `--egress-test-hosts`: no DNS at all, names mapped
// to loopback test servers), so tests never send anything off the machine;
// OnRecord hands each record to the caller as the connection ends.
//
// Invariants: the proxy dials only addresses it resolved and checked
// itself (or a test server named in TestHosts); it never forwards a request
// to a name outside the allowlist; it holds nothing of one job for another
// (one Proxy per job); when the job ends, its context ends the proxy and
// cuts every connection still open.
package egress
