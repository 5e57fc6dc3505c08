package netguard

import "net/netip"

// nonPublic are ranges that are not public unicast addresses, beyond those
// netip classifies itself (loopback, private, link-local, multicast,
// unspecified): the IANA IPv4 and IPv6 special-purpose address registries'
// entries that are not globally reachable, and the deprecated IPv6 forms
// that embed an IPv4 address. Any IPv6 address outside 2000::/3 (global
// unicast) is refused too (why).
var nonPublic = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a 'this network' address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a 6to4 relay anycast address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "an IPv4-mapped address"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated (SIIT) address"},
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("100:0:0:1::/64"), "a dummy IPv6 address"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address"},
	{netip.MustParsePrefix("2001::/23"), "an IETF protocol assignment address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address"},
	{netip.MustParsePrefix("3fff::/20"), "a documentation address"},
	{netip.MustParsePrefix("5f00::/16"), "a segment routing address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
}

// globalUnicast6 is the IPv6 global unicast space; nothing outside it is a
// public address.
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// Why returns "" when ip is a public unicast address or inside one of the
// allowed networks, else what kind of address it is ("a loopback address").
func Why(ip netip.Addr, allow []netip.Prefix) string {
	for _, p := range allow {
		if p.Contains(ip.Unmap()) {
			return ""
		}
	}
	if ip.Is4In6() {
		// An IPv4 address written as IPv6: say what the IPv4 address is
		// when that is the reason, else refuse the form itself.
		if w := Why(ip.Unmap(), allow); w != "" {
			return w
		}
		return "an IPv4-mapped address (name the IPv4 address itself)"
	}
	switch {
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsPrivate():
		return "a private address"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "a link-local address"
	case ip.IsUnspecified():
		return "an unspecified address"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "a multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	for _, n := range nonPublic {
		if n.prefix.Contains(ip) {
			return n.what
		}
	}
	if ip.Is6() && !globalUnicast6.Contains(ip) {
		return "a reserved IPv6 address (outside 2000::/3)"
	}
	return ""
}
