// Package egress is a job's way out, proposed and not yet wired to jobs: an
// HTTP proxy (CONNECT for TLS, plain HTTP in absolute form) that a worker
// would run for one job that asked for network. No job reaches it today:
// every job's network namespace holds only loopback and a job spec has no
// network field (docs/decisions/egress.md says what remains).
//
// It owns the allowlist (Rules: names and "*." suffixes, with ports; a job's
// rules must stay Within its tenant's) and the checks of every connection:
// the name asked for against the allowlist; the name resolved by the proxy
// itself and refused when any address is not public unicast (netguard),
// after resolution, so DNS rebinding and metadata addresses fail; a tunnel's
// TLS ClientHello must name the host the tunnel was asked for; per-job caps on
// connections, bytes and time. A refused request gets a plain-text HTTP
// error the program can read. Every connection leaves a Record (name,
// address, bytes each way, duration, allowed or why not).
//
// Seam: Config takes the Resolver and the Dial function, so tests run the
// proxy against fake names and local servers; OnRecord hands each record to
// the caller.
//
// Invariants: the proxy dials only addresses it resolved and checked
// itself; it never forwards a request to a name outside the allowlist; it
// holds nothing of one job for another (one Proxy per job).
package egress
