package callback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
)

// ErrRefusedAddress wraps every refusal of a callback address by the Guard.
var ErrRefusedAddress = errors.New("callback address refused")

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
// public callback receiver.
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// Guard decides which addresses callbacks may reach: public unicast
// addresses, plus the networks an operator allows.
type Guard struct {
	allow    []netip.Prefix
	resolver *net.Resolver
}

// NewGuard returns a Guard that also allows the given networks (for example
// 127.0.0.0/8 in tests, or an internal network of receivers).
func NewGuard(allow []netip.Prefix) *Guard {
	return &Guard{allow: allow, resolver: net.DefaultResolver}
}

// ParseNetworks parses a comma-separated list of CIDR networks ("" is none).
func ParseNetworks(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("callback network %q: use CIDR notation such as 10.0.0.0/8: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// why returns "" when ip may be called back, else what kind of address it is.
func (g *Guard) why(ip netip.Addr) string {
	for _, p := range g.allow {
		if p.Contains(ip.Unmap()) {
			return ""
		}
	}
	if ip.Is4In6() {
		// An IPv4 address written as IPv6: say what the IPv4 address is
		// when that is the reason, else refuse the form itself.
		if w := g.why(ip.Unmap()); w != "" {
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

// CheckIP returns an error wrapping ErrRefusedAddress when ip may not be called back.
func (g *Guard) CheckIP(ip netip.Addr) error {
	if w := g.why(ip); w != "" {
		return fmt.Errorf("%w: %s is %s", ErrRefusedAddress, ip, w)
	}
	return nil
}

// CheckURL resolves the URL's host and refuses it when any of its addresses
// may not be called back (a host with one public and one private address is
// refused: which one a connection uses is not ours to choose).
func (g *Guard) CheckURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("parse callback url: %w", err)
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); err == nil {
		return g.CheckIP(ip)
	}
	ips, err := g.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve callback host %s: %w", host, err)
	}
	for _, ip := range ips {
		if w := g.why(ip); w != "" {
			return fmt.Errorf("%w: host %s resolves to %s, %s", ErrRefusedAddress, host, ip.Unmap(), w)
		}
	}
	return nil
}

// control is a net.Dialer Control function: it refuses the connection when
// the address actually being dialed may not be called back, which is what
// defeats DNS rebinding (the name is resolved again at every connection).
func (g *Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse dialed address %q: %w", ErrRefusedAddress, address, err)
	}
	return g.CheckIP(ap.Addr())
}
