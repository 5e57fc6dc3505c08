package callback

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestGuardRefusesNonPublicAddresses(t *testing.T) {
	g := NewGuard(nil)
	for _, tc := range []struct{ ip, why string }{
		{"127.0.0.1", "loopback"}, {"::1", "loopback"}, {"10.1.2.3", "private"}, {"172.16.0.1", "private"},
		{"192.168.1.1", "private"}, {"fd00::1", "private"}, {"169.254.169.254", "link-local"}, {"fe80::1", "link-local"},
		{"0.0.0.0", "unspecified"}, {"100.64.0.1", "shared"}, {"224.0.0.1", "link-local"}, {"239.1.1.1", "multicast"}, {"::ffff:10.0.0.1", "private"},
		{"64:ff9b::a00:1", "NAT64"}, {"2002:a00:1::", "6to4"}, {"255.255.255.255", "broadcast"},
	} {
		err := g.CheckIP(netip.MustParseAddr(tc.ip))
		if !errors.Is(err, ErrRefusedAddress) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: err = %v; want a refusal saying %q", tc.ip, err, tc.why)
		}
	}
	for _, ip := range []string{"93.184.215.14", "2606:4700::6810:85e5", "8.8.8.8"} {
		if err := g.CheckIP(netip.MustParseAddr(ip)); err != nil {
			t.Errorf("%s is public: %v", ip, err)
		}
	}
}

// Every entry of IANA's IPv6 special-purpose address registry that is not
// globally reachable, the deprecated forms embedding an IPv4 address, and
// the unassigned space outside 2000::/3 are refused, at the first and last
// address of each range.
func TestGuardRefusesIANASpecialPurposeIPv6(t *testing.T) {
	g := NewGuard(nil)
	for _, tc := range []struct{ prefix, why string }{
		{"::1/128", "loopback"},
		{"::/128", "unspecified"},
		{"::/96", "IPv4-compatible"},       // deprecated (RFC 4291), ::8.8.8.8
		{"::ffff:0:0/96", ""},              // ::ffff:8.8.8.8 (its first address is 0.0.0.0, named as such)
		{"::ffff:0:0:0/96", "SIIT"},        // RFC 2765
		{"64:ff9b::/96", "NAT64"},          // RFC 6052
		{"64:ff9b:1::/48", "NAT64"},        // RFC 8215
		{"100::/64", "discard-only"},       // RFC 6666
		{"100:0:0:1::/64", "dummy"},        // RFC 9780
		{"2001::/23", ""},                  // RFC 2928 (its first address is Teredo's)
		{"2001::/32", "Teredo"},            // RFC 4380
		{"2001:2::/48", "IETF protocol"},   // benchmarking, RFC 5180
		{"2001:20::/28", "IETF protocol"},  // ORCHIDv2, RFC 7343
		{"2001:db8::/32", "documentation"}, // RFC 3849
		{"2002::/16", "6to4"},              // RFC 3056
		{"3fff::/20", "documentation"},     // RFC 9637
		{"5f00::/16", "segment routing"},   // RFC 9602
		{"fc00::/7", "private"},            // RFC 4193
		{"fe80::/10", "link-local"},        // RFC 4291
		{"fec0::/10", "site-local"},        // deprecated, RFC 3879
		{"ff00::/8", "multicast"},          // RFC 4291
		{"4000::/2", "outside 2000::/3"},   // unassigned
		{"::2:0:0/96", "outside 2000::/3"}, // reserved by IETF
	} {
		p := netip.MustParsePrefix(tc.prefix)
		first := p.Addr()
		last := first.As16()
		for i := p.Bits(); i < 128; i++ {
			last[i/8] |= 0x80 >> (i % 8)
		}
		for _, ip := range []netip.Addr{first, netip.AddrFrom16(last)} {
			if tc.prefix == "::/96" && ip == netip.IPv6Unspecified() {
				continue // named unspecified, checked above
			}
			err := g.CheckIP(ip)
			if !errors.Is(err, ErrRefusedAddress) {
				t.Errorf("%s (of %s) is accepted; want refused as %s", ip, tc.prefix, tc.why)
			} else if tc.prefix != "::/128" && tc.prefix != "::1/128" && tc.why != "" && ip == first && !strings.Contains(err.Error(), tc.why) {
				t.Errorf("%s (of %s): %v; want %q", ip, tc.prefix, err, tc.why)
			}
		}
	}
	for s, why := range map[string]string{"::8.8.8.8": "IPv4-compatible", "::ffff:8.8.8.8": "IPv4-mapped",
		"::ffff:0:8.8.8.8": "SIIT", "::ffff:169.254.169.254": "link-local"} {
		if err := g.CheckIP(netip.MustParseAddr(s)); !errors.Is(err, ErrRefusedAddress) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v; want refused as %s (an IPv4 address in an IPv6 form)", s, err, why)
		}
	}
	for _, s := range []string{"2606:4700::6810:85e5", "2a00:1450:4001:80e::200e", "2001:4860:4860::8888"} {
		if err := g.CheckIP(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s is public: %v", s, err)
		}
	}
}

func TestGuardAllowsConfiguredNetworks(t *testing.T) {
	nets, err := ParseNetworks([]string{"127.0.0.0/8", "", "10.1.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(nets)
	for _, ip := range []string{"127.0.0.1", "10.1.9.9", "::ffff:127.0.0.1"} {
		if err := g.CheckIP(netip.MustParseAddr(ip)); err != nil {
			t.Errorf("%s is in an allowed network: %v", ip, err)
		}
	}
	if err := g.CheckIP(netip.MustParseAddr("10.2.0.1")); err == nil {
		t.Error("10.2.0.1 is outside the allowed networks")
	}
	if _, err := ParseNetworks([]string{"10.0.0.1"}); err == nil {
		t.Error("a bare address is not a network")
	}
}

func TestCheckURLResolvesHostNames(t *testing.T) {
	g := NewGuard(nil)
	err := g.CheckURL(context.Background(), "http://localhost:9/hook")
	if !errors.Is(err, ErrRefusedAddress) || !strings.Contains(err.Error(), "localhost resolves to") {
		t.Fatalf("localhost: err = %v; want a refusal naming what it resolves to", err)
	}
	if err := g.CheckURL(context.Background(), "https://[::1]/x"); !errors.Is(err, ErrRefusedAddress) {
		t.Fatalf("[::1]: err = %v", err)
	}
}

func TestPolicyNamesWhy(t *testing.T) {
	p := Policy{Guard: NewGuard(nil), Secrets: func(t string) ([]byte, bool) { return []byte("s"), t == "acme" }}
	err := p.Check(context.Background(), "acme", "http://10.0.0.7/hook")
	if err == nil || !strings.Contains(err.Error(), "10.0.0.7 is a private address") || !strings.Contains(err.Error(), "callback_url") {
		t.Fatalf("err = %v", err)
	}
	err = p.Check(context.Background(), "other", "http://93.184.215.14/hook")
	if err == nil || !strings.Contains(err.Error(), "no callback signing secret") {
		t.Fatalf("err = %v", err)
	}
}
