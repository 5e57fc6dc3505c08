package kubernetes_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/kilnrun/kiln/internal/netguard"
)

// component mirrors a kustomize Component's fields the egress component uses.
type component struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// withComponent is the base's objects plus those of the component in dir,
// as `components: [dir]` in kustomization.yaml applies it.
func withComponent(t *testing.T, m manifests, dir string) manifests {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c component
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if c.Kind != "Component" || c.APIVersion != "kustomize.config.k8s.io/v1alpha1" {
		t.Fatalf("%s is a %s %s, not a kustomize Component", dir, c.APIVersion, c.Kind)
	}
	out := m
	out.objects = slices.Clone(m.objects)
	for _, res := range c.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(b) {
			_, obj, err := decodeNamed(doc)
			if err != nil {
				t.Fatalf("%s/%s document %d: %v", dir, res, i+1, err)
			}
			out.objects = append(out.objects, obj)
		}
	}
	return out
}

// egressAllowed reports whether the policies let a pod with podLabels open
// a TCP connection to addr:port outside the namespace (an address block
// peer) or to a pod with dstLabels (dstLabels non-nil), as NetworkPolicy
// semantics have it: a pod no Egress policy selects may reach anything; a
// selected one only what some rule of those policies admits.
func egressAllowed(t *testing.T, m manifests, podLabels map[string]string, addr netip.Addr, dstLabels map[string]string, port int32) bool {
	t.Helper()
	selected := false
	for _, obj := range m.objects {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !selects(t, np.Spec.PodSelector, podLabels) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Egress {
			if len(rule.Ports) > 0 && !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool {
				return p.Port != nil && p.Port.IntVal == port && (p.Protocol == nil || *p.Protocol == "TCP")
			}) {
				continue
			}
			if len(rule.To) == 0 {
				return true
			}
			for _, peer := range rule.To {
				switch {
				case peer.IPBlock != nil && dstLabels == nil:
					if inBlock(t, *peer.IPBlock, addr) {
						return true
					}
				case peer.PodSelector != nil && dstLabels != nil && peer.NamespaceSelector == nil:
					if selects(t, *peer.PodSelector, dstLabels) {
						return true
					}
				}
			}
		}
	}
	return !selected
}

func inBlock(t *testing.T, b networkingv1.IPBlock, addr netip.Addr) bool {
	t.Helper()
	p, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		t.Fatalf("ipBlock %q: %v", b.CIDR, err)
	}
	if !p.Contains(addr) {
		return false
	}
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			t.Fatalf("ipBlock except %q: %v", e, err)
		}
		if ep.Contains(addr) {
			return false
		}
	}
	return true
}

// The base lets a worker reach only Redis, NATS and DNS, so a job's egress
// proxy can reach no host; with the egress component on, the workers reach
// public addresses on 80 and 443 (what an egress= rule names by default),
// and still no private, loopback or metadata address, nor another port.
func TestWorkerEgressWhenTurnedOn(t *testing.T) {
	base := load(t)
	on := withComponent(t, base, "egress")
	worker := get[*appsv1.Deployment](t, base, "Deployment", "kiln-worker").Spec.Template.Labels
	redis := get[*appsv1.StatefulSet](t, base, "StatefulSet", "redis").Spec.Template.Labels
	public4, public6 := netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
	for _, c := range []struct {
		what      string
		addr      string
		port      int32
		base, on_ bool
	}{
		{"a public host, https", public4.String(), 443, false, true},
		{"a public host, http", public4.String(), 80, false, true},
		{"a public IPv6 host, https", public6.String(), 443, false, true},
		{"a public host, ssh", public4.String(), 22, false, false},
		{"a private address", "10.0.0.7", 443, false, false},
		{"a private address", "172.16.3.4", 443, false, false},
		{"a private address", "192.168.1.1", 80, false, false},
		{"the cloud metadata address", "169.254.169.254", 80, false, false},
		{"a shared address", "100.64.0.1", 443, false, false},
		{"loopback", "127.0.0.1", 443, false, false},
		{"a unique local IPv6 address", "fd00::1", 443, false, false},
	} {
		addr := netip.MustParseAddr(c.addr)
		if got := egressAllowed(t, base, worker, addr, nil, c.port); got != c.base {
			t.Errorf("base: worker to %s (%s:%d): %v, want %v", c.what, c.addr, c.port, got, c.base)
		}
		if got := egressAllowed(t, on, worker, addr, nil, c.port); got != c.on_ {
			t.Errorf("with egress: worker to %s (%s:%d): %v, want %v", c.what, c.addr, c.port, got, c.on_)
		}
	}
	// What the base admits stays admitted.
	for _, m := range []manifests{base, on} {
		if !egressAllowed(t, m, worker, netip.Addr{}, redis, 6379) || !egressAllowed(t, m, worker, netip.Addr{}, natsServer, 4222) {
			t.Error("the worker cannot reach Redis or NATS")
		}
	}
	// The API's pods are not given the workers' egress.
	api := get[*appsv1.Deployment](t, base, "Deployment", "kiln-api").Spec.Template.Labels
	for _, np := range on.objects {
		if p, ok := np.(*networkingv1.NetworkPolicy); ok && p.Name == "kiln-worker-egress" && selects(t, p.Spec.PodSelector, api) {
			t.Error("kiln-worker-egress selects the API's pods")
		}
	}
}

// Every range the component keeps workers from is one the proxy refuses
// too (internal/netguard): the two lists do not contradict each other.
func TestEgressExceptionsAreNotPublic(t *testing.T) {
	on := withComponent(t, load(t), "egress")
	n := 0
	for _, obj := range on.objects {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok || np.Name != "kiln-worker-egress" {
			continue
		}
		for _, rule := range np.Spec.Egress {
			for _, peer := range rule.To {
				if peer.IPBlock == nil {
					continue
				}
				for _, e := range peer.IPBlock.Except {
					p := netip.MustParsePrefix(e)
					n++
					if netguard.Why(p.Addr(), nil) == "" {
						t.Errorf("%s: the proxy would reach %s; the policy refuses it", e, p.Addr())
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no except ranges found in kiln-worker-egress")
	}
}

// Voluntary disruptions take one worker at a time (kube-score's critical
// "No matching PodDisruptionBudget"; docs/deployment.md answers the rest).
func TestWorkersHaveADisruptionBudget(t *testing.T) {
	m := load(t)
	pdb := get[*policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget", "kiln-worker")
	worker := get[*appsv1.Deployment](t, m, "Deployment", "kiln-worker").Spec.Template.Labels
	if pdb.Spec.Selector == nil || !selects(t, *pdb.Spec.Selector, worker) {
		t.Error("the kiln-worker PodDisruptionBudget does not select the workers")
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntVal != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("kiln-worker PodDisruptionBudget: maxUnavailable %v, minAvailable %v; want one worker at a time", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
}

// The manifests' comments send the operator to pages and sections that
// exist (the README's section once moved to docs/deployment.md, and the
// comments kept pointing at it).
func TestCommentsPointAtExistingSections(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	more, _ := filepath.Glob("*/*.yaml")
	ref := regexp.MustCompile(`((?:docs/)?[A-Za-z0-9_./-]+\.md)(?:,\s*"([^"]+)")?`)
	n := 0
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A reference may wrap onto the next comment line.
		text := regexp.MustCompile(`\n\s*#\s*`).ReplaceAllString(string(b), " ")
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			n++
			page, err := os.ReadFile(filepath.Join("..", "..", m[1]))
			if err != nil {
				t.Errorf("%s points at %s: %v", f, m[1], err)
				continue
			}
			if m[2] != "" && !regexp.MustCompile(`(?m)^#+ `+regexp.QuoteMeta(m[2])+`$`).Match(page) {
				t.Errorf("%s points at %s, section %q, which it does not have", f, m[1], m[2])
			}
		}
	}
	if n == 0 {
		t.Fatal("no reference to a page found: the check reads nothing")
	}
}
