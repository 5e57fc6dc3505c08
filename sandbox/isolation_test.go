package sandbox

import (
	"maps"
	"strings"
	"testing"
)

func TestIsolationFor(t *testing.T) {
	got, err := IsolationFor([]string{"python=gvisor", " node=runc ", ""})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"python": "gvisor", "node": "runc"}; !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range [][]string{{"python"}, {"python=kvm"}, {"Python=gvisor"}, {"python=gvisor", "python=runc"}} {
		if _, err := IsolationFor(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestIsolationChoice(t *testing.T) {
	base := `{"name":"x","language":"python","main_file":"main.py","classifier":"python","preload":[],"limits":{}`
	for _, tc := range []struct {
		profile, override string
		want              Isolation
	}{
		{base + `}`, "", IsolationRunc},
		{base + `,"isolation":"gvisor"}`, "", IsolationGVisor},
		{base + `,"isolation":"gvisor"}`, "runc", IsolationRunc},
		{base + `}`, "gvisor", IsolationGVisor},
	} {
		p, err := parseProfile(tc.profile)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Images: map[string]string{"x": "img"}}
		if tc.override != "" {
			cfg.Isolation = map[string]string{"x": tc.override}
		}
		cfg = cfg.withDefaults()
		got, err := cfg.isolationOf("x", p)
		if err != nil || got != tc.want {
			t.Errorf("profile %s, override %q: got %q %v, want %q", tc.profile, tc.override, got, err, tc.want)
		}
		if bin := cfg.binaryFor(got); (got == IsolationGVisor) != (bin == RunscDefault) {
			t.Errorf("isolation %s runs %s", got, bin)
		}
	}
	if _, err := parseProfile(base + `,"isolation":"kata"}`); err == nil || !strings.Contains(err.Error(), "isolation") {
		t.Errorf("unknown isolation in a profile: %v", err)
	}
	err := Config{Images: map[string]string{"x": "img"}, Isolation: map[string]string{"y": "gvisor"}}.Validate()
	if err == nil || !strings.Contains(err.Error(), `"y"`) {
		t.Errorf("isolation of a runtime not served: %v", err)
	}
}
