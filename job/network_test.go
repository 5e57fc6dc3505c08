package job

import "testing"

func TestNetworkIsPartOfTheKey(t *testing.T) {
	t.Parallel()
	base := Spec{Runtime: "python", Code: "print(1)", Limits: DefaultLimits}
	none := Key(base, "sha256:a")
	empty := base
	empty.Network = &Network{}
	if Key(empty, "sha256:a") != none {
		t.Error("an empty allowlist changed the key: it is no network, like none")
	}
	one := base
	one.Network = &Network{Allow: []string{"api.example.org"}}
	other := base
	other.Network = &Network{Allow: []string{"api.example.org:443"}}
	two := base
	two.Network = &Network{Allow: []string{"api.example.org", "x.example.org"}}
	keys := map[string]string{"none": none}
	for name, s := range map[string]Spec{"one": one, "other port": other, "two": two} {
		k := Key(s, "sha256:a")
		for prev, pk := range keys {
			if k == pk {
				t.Errorf("allowlist %s has the key of %s", name, prev)
			}
		}
		keys[name] = k
	}
	// Entries are length-prefixed: moving a boundary changes the key.
	a, b := base, base
	a.Network = &Network{Allow: []string{"a.example.org", "b.example.org"}}
	b.Network = &Network{Allow: []string{"a.example.orgb.example.org"}}
	if Key(a, "d") == Key(b, "d") {
		t.Error("allowlist entry boundaries are ambiguous")
	}
}

func TestANetworkJobUsesTheCacheOnlyWhenItAsks(t *testing.T) {
	t.Parallel()
	net := &Network{Allow: []string{"api.example.org"}}
	for _, tc := range []struct {
		name    string
		network *Network
		cache   *CachePolicy
		want    bool
	}{
		{"no network, no policy", nil, nil, true},
		{"no network, false", nil, CacheOff(), false},
		{"empty allowlist, no policy", &Network{}, nil, true},
		{"network, no policy", net, nil, false},
		{"network, true", net, &CachePolicy{}, true},
		{"network, max age", net, &CachePolicy{MaxAgeS: 60}, true},
		{"network, false", net, CacheOff(), false},
	} {
		if got := (Spec{Network: tc.network, Cache: tc.cache}).CacheEnabled(); got != tc.want {
			t.Errorf("%s: CacheEnabled %v, want %v", tc.name, got, tc.want)
		}
	}
}
