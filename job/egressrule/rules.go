package egressrule

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Rule allows connections to one host name, or to every name under a
// suffix ("*.data.gov": x.data.gov and a.b.data.gov, not data.gov itself),
// on one port or (Port 0) on 80 and 443.
type Rule struct {
	Host string // lower case, no trailing dot; "*." prefix for a suffix
	Port int
}

// String is the rule as written in a key file or a job.
func (r Rule) String() string {
	if r.Port == 0 {
		return r.Host
	}
	return r.Host + ":" + strconv.Itoa(r.Port)
}

// Rules is an allowlist: a connection is allowed when any rule allows it.
type Rules []Rule

// String is the allowlist as written in a key file.
func (rs Rules) String() string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// ParseRules reads a comma-separated allowlist ("api.example.org,
// *.data.gov:443"); "" is none. Every entry is a DNS name (letters, digits,
// hyphens, dots) or "*." and one, with an optional port. IP addresses are
// refused: a rule names what the program asks for, and the proxy resolves
// it itself.
func ParseRules(s string) (Rules, error) {
	var out Rules
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r, err := parseRule(f)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseRule(s string) (Rule, error) {
	host, port := s, 0
	if h, p, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Rule{}, fmt.Errorf("egress rule %q: the port must be a number from 1 to 65535", s)
		}
		host, port = h, n
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	name := strings.TrimPrefix(host, "*.")
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return Rule{}, fmt.Errorf("egress rule %q: name a host, not an address (the proxy resolves names itself and refuses private addresses)", s)
	}
	if !ValidName(name) || strings.Contains(name, "*") {
		return Rule{}, fmt.Errorf("egress rule %q: want a DNS name such as api.example.org or *.example.org, with an optional :port", s)
	}
	return Rule{Host: host, Port: port}, nil
}

// ValidName reports whether s is a DNS name of at least two labels.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// NormalHost is host as rules compare it: lower case, no trailing dot.
func NormalHost(host string) string { return strings.TrimSuffix(strings.ToLower(host), ".") }

// Allows reports whether a connection to host:port is allowed.
func (rs Rules) Allows(host string, port int) bool {
	host = NormalHost(host)
	for _, r := range rs {
		if r.Port == 0 && port != 80 && port != 443 || r.Port != 0 && r.Port != port {
			continue
		}
		if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
		} else if host == r.Host {
			return true
		}
	}
	return false
}

// Within returns the first rule of rs that outer does not cover (a job's
// allowlist must stay within its tenant's), or ok. A suffix rule is covered
// only by an equal or wider suffix rule; a port-less rule (80 and 443) only
// by rules covering both ports.
func (rs Rules) Within(outer Rules) (bad Rule, ok bool) {
	for _, r := range rs {
		ports := []int{r.Port}
		if r.Port == 0 {
			ports = []int{80, 443}
		}
		for _, p := range ports {
			if !outer.covers(r.Host, p) {
				return r, false
			}
		}
	}
	return Rule{}, true
}

// covers reports whether every name host (a name or a "*." suffix) stands
// for is allowed on port.
func (rs Rules) covers(host string, port int) bool {
	suffix, wild := strings.CutPrefix(host, "*.")
	for _, o := range rs {
		if o.Port != 0 && o.Port != port || o.Port == 0 && port != 80 && port != 443 {
			continue
		}
		osuffix, owild := strings.CutPrefix(o.Host, "*.")
		switch {
		case !wild && !owild && o.Host == host,
			!wild && owild && strings.HasSuffix(host, "."+osuffix),
			wild && owild && (suffix == osuffix || strings.HasSuffix(suffix, "."+osuffix)):
			return true
		}
	}
	return false
}
