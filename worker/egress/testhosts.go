package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/kilnrun/kiln/job/egressrule"
)

// TestHosts is the test-only name table (`kiln worker --egress-test-hosts`,
// KILN_EGRESS_TEST_HOSTS): with it, the proxy resolves no name through DNS
// at all, so a test never sends anything off the machine.
//
//   - NAME=ADDR:PORT maps NAME to a server the test started: a job allowed
//     NAME connects there, whatever port it asked for. This is the only way
//     a loopback (or any non-public) address is ever reached.
//   - NAME=ADDR makes NAME resolve to ADDR and nothing more: the address is
//     checked as any resolved address is (a private or loopback one is
//     refused), which is how tests show that DNS answers are checked.
//
// Every other name does not resolve.
type TestHosts struct {
	Servers map[string]netip.AddrPort
	Names   map[string]netip.Addr
}

// ParseTestHosts reads "files.test=127.0.0.1:8443,inner.test=10.1.2.3".
func ParseTestHosts(s string) (*TestHosts, error) {
	th := &TestHosts{Servers: map[string]netip.AddrPort{}, Names: map[string]netip.Addr{}}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, target, ok := strings.Cut(f, "=")
		name = egressrule.NormalHost(name)
		if !ok || !egressrule.ValidName(name) {
			return nil, fmt.Errorf("egress test host %q: want NAME=ADDR:PORT or NAME=ADDR with a DNS name of two labels or more", f)
		}
		if ap, err := netip.ParseAddrPort(target); err == nil {
			th.Servers[name] = ap
			continue
		}
		a, err := netip.ParseAddr(target)
		if err != nil {
			return nil, fmt.Errorf("egress test host %q: %q is neither ADDR:PORT nor ADDR", f, target)
		}
		th.Names[name] = a
	}
	if len(th.Servers)+len(th.Names) == 0 {
		return nil, nil
	}
	return th, nil
}

// LookupNetIP resolves from the table only.
func (th *TestHosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	host = egressrule.NormalHost(host)
	if ap, ok := th.Servers[host]; ok {
		return []netip.Addr{ap.Addr()}, nil
	}
	if a, ok := th.Names[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host (egress test hosts: only the names given resolve)", Name: host, IsNotFound: true}
}

// server is the test server NAME maps to.
func (th *TestHosts) server(host string) (netip.AddrPort, bool) {
	if th == nil {
		return netip.AddrPort{}, false
	}
	ap, ok := th.Servers[egressrule.NormalHost(host)]
	return ap, ok
}
