package netguard

import (
	"net/netip"
	"strings"
	"testing"
)

func TestWhy(t *testing.T) {
	for _, tc := range []struct{ ip, why string }{
		{"127.0.0.1", "loopback"}, {"10.0.0.1", "private"}, {"169.254.169.254", "link-local"},
		{"::ffff:192.168.0.1", "private"}, {"fd00:ec2::254", "private"}, {"100.64.0.1", "shared"},
		{"2001:db8::1", "documentation"}, {"8.8.8.8", ""}, {"2606:4700::1", ""},
	} {
		got := Why(netip.MustParseAddr(tc.ip), nil)
		if (tc.why == "") != (got == "") || !strings.Contains(got, tc.why) {
			t.Errorf("Why(%s) = %q; want %q", tc.ip, got, tc.why)
		}
	}
	if got := Why(netip.MustParseAddr("127.0.0.1"), []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}); got != "" {
		t.Errorf("an allowed network: %q", got)
	}
}
