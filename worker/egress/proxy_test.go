package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job/egressrule"
)

// names resolves every name in it to its addresses, and nothing else.
type names map[string][]netip.Addr

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

var (
	loopback  = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	loopbacks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
)

// startProxy serves cfg's proxy on loopback and returns its address and the
// proxy; the records of ended connections arrive on the returned channel.
func startProxy(t *testing.T, cfg Config) (string, *Proxy, <-chan Record) {
	t.Helper()
	recs := make(chan Record, 64)
	cfg.OnRecord = func(r Record) { recs <- r }
	p := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := p.Serve(ctx, ln); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ln.Addr().String(), p, recs
}

// client is an HTTP client that goes through the proxy at addr and trusts
// srv's certificate, whatever name it is asked for.
func client(addr string, srv *httptest.Server) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr}), DisableKeepAlives: true}
	if srv != nil && srv.TLS != nil {
		tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func port(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	u, _ := url.Parse(srv.URL)
	return u.Port()
}

func next(t *testing.T, recs <-chan Record) Record {
	t.Helper()
	return testkit.Receive(t, recs, 10*time.Second, "a record of the connection")
}

func TestTunnelToAnAllowedName(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+r.Host) }))
	defer srv.Close()
	rules, err := egressrule.ParseRules("api.example.test:" + port(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	addr, p, recs := startProxy(t, Config{Allow: rules, Resolver: names{"api.example.test": loopback}, AllowNets: loopbacks})
	// The test server's certificate names example.com; the client checks
	// it against that name while asking for api.example.test.
	c := client(addr, srv)
	c.Transport.(*http.Transport).TLSClientConfig.ServerName = "api.example.test"
	c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
	resp, err := c.Get("https://api.example.test:" + port(t, srv) + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "hello from api.example.test") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	r := next(t, recs)
	if !r.Allowed || r.Method != "CONNECT" || r.Host != "api.example.test" || !strings.HasPrefix(r.Addr, "127.0.0.1:") || r.BytesUp == 0 || r.BytesDown == 0 {
		t.Fatalf("record %+v", r)
	}
	if s := p.Egress(); s.Connections != 1 || s.Refused != 0 || len(s.Records) != 1 {
		t.Fatalf("summary %+v", s)
	}
}

func TestPlainHTTPToAnAllowedName(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s %q %q", r.Method, r.Host, r.URL.Path, b, r.Header.Get("Proxy-Authorization"))
	}))
	defer srv.Close()
	rules, _ := egressrule.ParseRules("*.example.test:" + port(t, srv))
	addr, _, recs := startProxy(t, Config{Allow: rules, Resolver: names{"data.example.test": loopback}, AllowNets: loopbacks})
	resp, err := client(addr, nil).Post("http://data.example.test:"+port(t, srv)+"/up", "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := fmt.Sprintf("POST data.example.test:%s /up \"payload\" \"\"", port(t, srv))
	if string(b) != want {
		t.Fatalf("got %q, want %q", b, want)
	}
	if r := next(t, recs); !r.Allowed || r.Method != "POST" || r.BytesUp != 7 || r.BytesDown == 0 {
		t.Fatalf("record %+v", r)
	}
}

// refused asks the proxy at addr for target and returns the answer's
// status and body (CONNECT when https).
func refused(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	resp, err := client(addr, nil).Get(target)
	if err != nil {
		// A refused CONNECT surfaces as the client's error, with the status.
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("X-Kiln-Egress") != "refused" {
		t.Errorf("answer %d without X-Kiln-Egress: refused", resp.StatusCode)
	}
	return resp.StatusCode, string(b)
}

func TestRefusals(t *testing.T) {
	rules, _ := egressrule.ParseRules("api.example.test,rebind.example.test")
	for _, tc := range []struct {
		name, target string
		cfg          Config
		want         string
	}{
		{"not allowed", "http://other.example.test/", Config{}, "other.example.test:80 is not in this job's allowlist (allowed: api.example.test,rebind.example.test)"},
		{"not allowed port", "http://api.example.test:8080/", Config{}, "api.example.test:8080 is not in this job's allowlist"},
		// A name the allowlist holds that resolves to an internal address:
		// refused after resolution (DNS rebinding, metadata services).
		{"loopback", "http://rebind.example.test/", Config{}, "resolves to 127.0.0.1, a loopback address"},
		{"metadata", "http://api.example.test/", Config{Resolver: names{"api.example.test": {netip.MustParseAddr("169.254.169.254")}}}, "a link-local address"},
		{"one of two", "http://api.example.test/", Config{Resolver: names{"api.example.test": {netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("10.0.0.1")}}}, "10.0.0.1, a private address"},
		{"mapped", "http://api.example.test/", Config{Resolver: names{"api.example.test": {netip.MustParseAddr("::ffff:127.0.0.1")}}}, "loopback"},
		{"unresolvable", "http://api.example.test/", Config{Resolver: names{}}, "cannot resolve api.example.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Allow = rules
			if cfg.Resolver == nil {
				cfg.Resolver = names{"rebind.example.test": loopback, "api.example.test": loopback, "other.example.test": loopback}
			}
			// A dialer that fails the test: nothing refused may be dialed.
			cfg.Dial = func(_ context.Context, _, a string) (net.Conn, error) {
				t.Errorf("dialed %s", a)
				return nil, fmt.Errorf("no")
			}
			addr, _, recs := startProxy(t, cfg)
			status, body := refused(t, addr, tc.target)
			if status < 400 || !strings.Contains(body, tc.want) {
				t.Fatalf("got %d %q; want a refusal saying %q", status, body, tc.want)
			}
			if r := next(t, recs); r.Allowed || !strings.Contains(r.Reason, tc.want) {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

func TestConnectRefusedBeforeTheTunnel(t *testing.T) {
	addr, _, recs := startProxy(t, Config{Resolver: names{"api.example.test": loopback}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 403 ") || !strings.Contains(string(b), "(allowed: none)") {
		t.Fatalf("%q", b)
	}
	if r := next(t, recs); r.Allowed || r.Method != "CONNECT" {
		t.Fatalf("record %+v", r)
	}
}

// A tunnel asked for an allowed name must carry TLS for that name: another
// server name, or no TLS at all, closes it before anything reaches the
// upstream.
func TestTunnelMustNameItsHost(t *testing.T) {
	var got sync.Map
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Store(r.Host, true) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	defer srv.Close()
	rules, _ := egressrule.ParseRules("api.example.test:" + port(t, srv))
	addr, _, recs := startProxy(t, Config{Allow: rules, Resolver: names{"api.example.test": loopback}, AllowNets: loopbacks})
	for _, tc := range []struct {
		name, sni string
		tls       bool
		want      string
	}{
		{"another name", "evil.example.test", true, `the TLS server name "evil.example.test" is not the tunnel's host api.example.test`},
		{"no TLS", "", false, "must start with a TLS ClientHello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "CONNECT api.example.test:%s HTTP/1.1\r\nHost: x\r\n\r\n", port(t, srv))
			buf := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
			if _, err := io.ReadFull(c, buf); err != nil || !strings.HasPrefix(string(buf), "HTTP/1.1 200") {
				t.Fatalf("%q %v", buf, err)
			}
			if tc.tls {
				err = tls.Client(c, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true}).Handshake()
			} else {
				_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
				_, err = c.Read(make([]byte, 1))
			}
			if err == nil {
				t.Fatal("the tunnel carried the connection")
			}
			if r := next(t, recs); r.Allowed || !strings.Contains(r.Reason, tc.want) || r.BytesDown != 0 {
				t.Fatalf("record %+v; want refused: %s", r, tc.want)
			}
		})
	}
	got.Range(func(k, _ any) bool { t.Errorf("the upstream served %v", k); return true })
}

func TestCaps(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Repeat("x", 64<<10)))
	}))
	defer srv.Close()
	rules, _ := egressrule.ParseRules("api.example.test:" + port(t, srv))
	addr, _, recs := startProxy(t, Config{Allow: rules, Resolver: names{"api.example.test": loopback}, AllowNets: loopbacks,
		MaxConns: 2, MaxBytes: 100 << 10})
	target := "http://api.example.test:" + port(t, srv) + "/"
	for i := range 2 {
		resp, err := client(addr, nil).Get(target)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := next(t, recs)
		if i == 0 && (len(b) != 64<<10 || r.Reason != "") {
			t.Fatalf("first: %d bytes, record %+v", len(b), r)
		}
		if i == 1 && (len(b) >= 64<<10 || !strings.Contains(r.Reason, "cut at the job's 102400 bytes")) {
			t.Fatalf("second, over the byte budget: %d bytes, record %+v", len(b), r)
		}
	}
	status, body := refused(t, addr, target)
	if status != http.StatusTooManyRequests || !strings.Contains(body, "at most 2 connections") {
		t.Fatalf("third connection: %d %q", status, body)
	}
}
