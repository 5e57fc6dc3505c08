package producer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
)

// parseAllowEntry reads one entry of a job's allowlist: exactly one rule.
func parseAllowEntry(entry string) (egressrule.Rule, error) {
	if strings.TrimSpace(entry) == "" {
		return egressrule.Rule{}, fmt.Errorf("the entry is empty: name a host such as api.example.org, *.example.org or api.example.org:8443")
	}
	if strings.Contains(entry, ",") {
		return egressrule.Rule{}, fmt.Errorf("%q holds a comma: give one host per entry of \"allow\"", entry)
	}
	rules, err := egressrule.ParseRules(entry)
	if err != nil {
		return egressrule.Rule{}, err // names the entry and what to write instead
	}
	return rules[0], nil
}

// egressRefusal is the refusal of a rule its tenant's allowance does not
// cover, or nil when it does.
func egressRefusal(rule egressrule.Rule, allowance egressrule.Rules) *refusal {
	if len(allowance) == 0 {
		return &refusal{kind: errEgressNotAllowed, detail: fmt.Sprintf("this API key allows no network, so the job cannot reach %s: remove \"network\", or ask the operator for a key with an egress allowance (egress= in the key file)", rule)}
	}
	if _, ok := (egressrule.Rules{rule}).Within(allowance); ok {
		return nil
	}
	detail := fmt.Sprintf("host %s is not within this key's egress allowance (%s): allow only hosts it covers, or ask the operator to widen the key's egress=",
		rule, strings.ReplaceAll(allowance.String(), ",", ", "))
	if rule.Port == 0 {
		// A rule without a port stands for 80 and 443; the allowance may
		// cover one of them.
		for _, port := range []int{443, 80} {
			narrow := egressrule.Rule{Host: rule.Host, Port: port}
			if _, ok := (egressrule.Rules{narrow}).Within(allowance); ok {
				detail = fmt.Sprintf("host %s (ports 80 and 443) is not within this key's egress allowance (%s), which allows it on port %d only: write %s",
					rule, strings.ReplaceAll(allowance.String(), ",", ", "), port, narrow)
				break
			}
		}
	}
	return &refusal{kind: errEgressNotAllowed, detail: detail}
}

// checkNetwork checks a job's network allowlist against its tenant's egress
// allowance (Tenant.Egress) and returns it in the canonical form workers
// and the cache key see: each rule as egressrule.Rule.String writes it (lower
// case, no trailing dot), sorted, de-duplicated; nil when it allows
// nothing. An entry that is not a rule is an *job.InvalidError; a rule the
// allowance does not cover is errEgressNotAllowed naming the host and the
// allowance.
func (t *tenants) checkNetwork(tenant string, n *job.Network) (*job.Network, error) {
	if n.Empty() {
		return nil, nil
	}
	if len(n.Allow) > job.MaxNetworkAllow {
		return nil, &job.InvalidError{Field: "network.allow",
			Message: fmt.Sprintf("%d entries; the maximum is %d (a suffix rule such as *.example.org covers many hosts)", len(n.Allow), job.MaxNetworkAllow)}
	}
	allowance := t.tenant(tenant).Egress
	out := make([]string, 0, len(n.Allow))
	for i, entry := range n.Allow {
		field := fmt.Sprintf("network.allow[%d]", i)
		rule, err := parseAllowEntry(entry)
		if err != nil {
			return nil, &job.InvalidError{Field: field, Message: err.Error()}
		}
		if r := egressRefusal(rule, allowance); r != nil {
			r.field = field
			return nil, r
		}
		out = append(out, rule.String())
	}
	slices.Sort(out)
	return &job.Network{Allow: slices.Compact(out)}, nil
}
