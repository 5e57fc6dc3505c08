package callback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"

	"github.com/kilnrun/kiln/internal/netguard"
)

// ErrRefusedAddress wraps every refusal of a callback address by the Guard.
var ErrRefusedAddress = errors.New("callback address refused")

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
func (g *Guard) why(ip netip.Addr) string { return netguard.Why(ip, g.allow) }

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
