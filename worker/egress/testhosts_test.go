package egress

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job/egressrule"
)

func TestParseTestHosts(t *testing.T) {
	th, err := ParseTestHosts(" files.test=127.0.0.1:8443, inner.test=10.1.2.3 ")
	if err != nil {
		t.Fatal(err)
	}
	if ap := th.Servers["files.test"]; ap.String() != "127.0.0.1:8443" {
		t.Fatalf("server of files.test = %v", ap)
	}
	if a := th.Names["inner.test"]; a.String() != "10.1.2.3" {
		t.Fatalf("name inner.test = %v", a)
	}
	for _, bad := range []string{"files.test", "localhost=127.0.0.1:1", "a.test=nowhere", "a.test=127.0.0.1:99999"} {
		if _, err := ParseTestHosts(bad); err == nil {
			t.Errorf("ParseTestHosts(%q) accepted it", bad)
		}
	}
	if th, err := ParseTestHosts(""); th != nil || err != nil {
		t.Fatalf("empty: %v %v", th, err)
	}
}

// A mapped name reaches its test server on whatever port was asked; a name
// that merely resolves to loopback is refused after resolution; any other
// name does not resolve (no DNS query leaves the machine).
func TestTestHostsMapOnlyTheirServers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "file for "+r.Host) }))
	defer srv.Close()
	th, err := ParseTestHosts("files.test=" + strings.TrimPrefix(srv.URL, "http://") + ",rebind.test=127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := egressrule.ParseRules("files.test,rebind.test,nowhere.test")
	addr, _, recs := startProxy(t, Config{Allow: rules, TestHosts: th})
	c := client(addr, nil)

	resp, err := c.Get("http://files.test/data.csv")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "file for files.test" {
		t.Fatalf("mapped: %d %q", resp.StatusCode, b)
	}
	if r := next(t, recs); !r.Allowed || r.Addr != strings.TrimPrefix(srv.URL, "http://") {
		t.Fatalf("mapped record %+v", r)
	}

	for host, want := range map[string]string{"rebind.test": "resolves to 127.0.0.1", "nowhere.test": "cannot resolve"} {
		resp, err := c.Get("http://" + host + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %q, want a refusal saying %q", host, resp.StatusCode, b, want)
		}
		if r := next(t, recs); r.Allowed || !strings.Contains(r.Reason, want) {
			t.Fatalf("%s record %+v", host, r)
		}
	}
}
