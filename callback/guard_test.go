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
