// Package egress is a job's way out: an HTTP proxy (CONNECT for TLS, plain
// HTTP in absolute form) that a worker runs for one job that asked for
// network, reachable from inside the job's loopback-only network namespace.
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
// Invariants: the proxy dials only addresses it resolved and checked
// itself; it never forwards a request to a name outside the allowlist; it
// holds nothing of one job for another (one Proxy per job).
package egress
