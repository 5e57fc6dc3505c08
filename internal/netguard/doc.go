// Package netguard says whether an address is a public unicast address,
// the only kind traffic leaving the host on a job's behalf (callbacks,
// egress) may reach unless an operator allows a network.
//
// It owns the table of non-public ranges (netip's own classes, and the IANA
// special-purpose registries' entries that are not globally reachable), and
// nothing else.
//
// Seam: Why returns the reason an address is refused (empty when it is
// allowed); callback and worker/egress call it.
//
// Invariants: it resolves nothing: callers check every address they are
// about to dial. An IPv4 address written in an IPv6 form is refused, with
// the IPv4 address's own reason when it has one; nothing outside 2000::/3
// is a public IPv6 address.
package netguard
