package egressrule

import "testing"

func TestRules(t *testing.T) {
	rs, err := ParseRules(" API.example.org. , *.data.gov:443,localhost.test:8443")
	if err != nil {
		t.Fatal(err)
	}
	if rs.String() != "api.example.org,*.data.gov:443,localhost.test:8443" {
		t.Fatalf("%s", rs)
	}
	for _, tc := range []struct {
		host string
		port int
		want bool
	}{
		{"api.example.org", 443, true}, {"api.example.org", 80, true}, {"api.example.org", 8080, false},
		{"API.EXAMPLE.ORG.", 443, true}, {"x.api.example.org", 443, false}, {"example.org", 443, false},
		{"a.data.gov", 443, true}, {"a.b.data.gov", 443, true}, {"data.gov", 443, false}, {"a.data.gov", 80, false},
		{"evildata.gov", 443, false}, {"localhost.test", 8443, true},
	} {
		if got := rs.Allows(tc.host, tc.port); got != tc.want {
			t.Errorf("Allows(%s, %d) = %v", tc.host, tc.port, got)
		}
	}
	for _, bad := range []string{"10.0.0.1", "[::1]:443", "*.com.*", "*.org", "no_underscore.org", "single", "a.org:0", "a.org:x", "*"} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("ParseRules(%q) accepted", bad)
		}
	}
	tenant, _ := ParseRules("*.example.org,api.other.org:443")
	for _, tc := range []struct {
		job string
		bad string
	}{
		{"a.example.org", ""}, {"*.x.example.org", ""}, {"api.other.org:443", ""},
		{"*.other.org", "*.other.org"}, {"example.org", "example.org"}, {"api.other.org", "api.other.org"}, {"a.example.org:22", "a.example.org:22"},
	} {
		job, _ := ParseRules(tc.job)
		bad, ok := job.Within(tenant)
		if ok != (tc.bad == "") || !ok && bad.String() != tc.bad {
			t.Errorf("%s within %s: %v %s", tc.job, tenant, ok, bad)
		}
	}
}
