package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/egresstest"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/worker/egress"
)

// serveFunc is a Network served by a function, as the worker's proxy is.
type serveFunc func(ctx context.Context, ln net.Listener) *job.Egress

func (serveFunc) Enabled() bool { return true }

func (f serveFunc) Serve(ctx context.Context, ln net.Listener) *job.Egress { return f(ctx, ln) }

// egressJob runs spec as tenant's job with a Network like the worker's: a
// proxy for the spec's own allowlist that knows only th's names (no DNS).
func egressJob(t *testing.T, rt *Containerd, tenant string, spec job.Spec, th *egress.TestHosts, tweak func(*egress.Config)) job.Result {
	t.Helper()
	hook := func(ctx context.Context, ln net.Listener) *job.Egress {
		rules, err := egressrule.ParseRules(strings.Join(spec.Network.Allow, ","))
		if err != nil {
			t.Errorf("allowlist: %v", err)
		}
		cfg := egress.Config{Allow: rules, TestHosts: th}
		if tweak != nil {
			tweak(&cfg)
		}
		p := egress.New(cfg)
		if err := p.Serve(ctx, ln); err != nil {
			t.Errorf("Serve: %v", err)
		}
		return p.Egress()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := rt.Run(ctx, Request{ID: job.NewID(), Spec: spec, Tenant: tenant, Network: serveFunc(hook)})
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	return res
}

// egressSetup is a test server for files.test (TLS) and plain.test (HTTP),
// the name table mapping them, and the files and variables that make a
// job trust the server's authority.
func egressSetup(t *testing.T, more string) (*egresstest.Server, *egress.TestHosts, []job.File, map[string]string) {
	t.Helper()
	srv := egresstest.New(t, "files.test", "other.test")
	hosts := srv.Hosts("files.test", "plain.test")
	if more != "" {
		hosts += "," + more
	}
	th, err := egress.ParseTestHosts(hosts)
	if err != nil {
		t.Fatal(err)
	}
	files := []job.File{{Name: "ca.pem", Content: string(srv.CAPEM)}}
	env := map[string]string{"SSL_CERT_FILE": "/work/ca.pem", "REQUESTS_CA_BUNDLE": "/work/ca.pem", "NODE_EXTRA_CA_CERTS": "/work/ca.pem"}
	return srv, th, files, env
}

func netSpec(spec job.Spec, files []job.File, env map[string]string, allow ...string) job.Spec {
	spec.Files, spec.Env = files, env
	if len(allow) > 0 {
		spec.Network = &job.Network{Allow: allow}
	}
	return spec
}

// fetchAll fetches each URL with urllib, requests (TLS only) and prints one
// line per try: "ok <body>" or "err <seconds> <error>".
const fetchAll = `
import sys, time, urllib.request, requests
def line(how, f):
    t = time.monotonic()
    try:
        print("ok", how, f())
    except Exception as e:
        print("err", how, "%.1f" % (time.monotonic() - t), type(e).__name__, str(e).replace("\n", " ")[:300])
for u in sys.argv[1:]:
    line("urllib", lambda: urllib.request.urlopen(u, timeout=20).read().decode()[:80])
    line("requests", lambda: requests.get(u, timeout=20).text[:80])
`

// seconds reads a printed duration ("1.5"); unreadable is forever.
func seconds(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 1e9
	}
	return f
}

// A job allowed files.test and plain.test fetches from the test servers by
// name with urllib and requests; without a policy the same job fails fast.
func TestEgressFetchesAllowedNames(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	_, th, files, env := egressSetup(t, "")
	spec := py(fetchAll)
	spec.Args = []string{"https://files.test/hello", "http://plain.test/hello"}

	res := egressJob(t, rt, "acme", netSpec(spec, files, env, "files.test", "plain.test"), th, nil)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	want := "ok urllib hello from files.test\nok requests hello from files.test\nok urllib hello from plain.test\nok requests hello from plain.test\n"
	if res.Stdout != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", res.Stdout, want)
	}
	if e := res.Egress; e == nil || e.Connections != 4 || e.Refused != 0 || e.BytesDown == 0 || len(e.Records) != 4 {
		t.Fatalf("egress account %+v", e)
	}
	for _, r := range res.Egress.Records {
		if !r.Allowed || (r.Host != "files.test" && r.Host != "plain.test") {
			t.Fatalf("record %+v", r)
		}
	}

	// No policy: no proxy, no names, no route; it fails at once.
	res = egressJob(t, rt, "acme", netSpec(spec, files, env), th, nil)
	if res.Egress != nil {
		t.Fatalf("a job without a network has an egress account: %+v", res.Egress)
	}
	for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "err" || seconds(f[2]) > 5 {
			t.Fatalf("without a policy, want every fetch to fail within 5 s:\n%s\n%s", res.Stdout, res.Stderr)
		}
	}
}

// Refused, each fast and with a readable reason, and each in the account:
// a name not allowed, a name whose answer is loopback, an IP literal, a
// tunnel whose TLS names another host, a redirect to a refused host, the
// byte cap; and around the proxy, raw sockets and DNS go nowhere.
func TestEgressRefusals(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	srv, th, files, env := egressSetup(t, "rebind.test=127.0.0.1,inner.test=10.1.2.3")
	code := `
import socket, ssl, sys, time, urllib.request
def line(what, f):
    t = time.monotonic()
    try:
        print(what, "ok", f())
    except Exception as e:
        print(what, "err %.1f" % (time.monotonic() - t), type(e).__name__, str(e).replace("\n", " ")[:300])
get = lambda u: urllib.request.urlopen(u, timeout=20).read()[:60]
def body(u):
    try:
        return get(u)
    except urllib.error.HTTPError as e:
        raise OSError("%d %s" % (e.code, e.read().decode()))
line("not-allowed", lambda: body("http://other.test/hello"))
line("not-allowed-tls", lambda: get("https://other.test/hello"))
line("rebind", lambda: body("http://rebind.test/hello"))
line("private", lambda: body("http://inner.test/hello"))
line("ip-literal", lambda: body("http://127.0.0.1:%s/hello" % sys.argv[1]))
def sni():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT files.test:443 HTTP/1.1\r\nHost: files.test:443\r\n\r\n")
    s.recv(4096)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s, server_hostname="other.test")
    t.sendall(b"GET /hello HTTP/1.1\r\nHost: other.test\r\n\r\n")
    return t.recv(100)
line("sni", sni)
line("redirect", lambda: body("http://plain.test/redirect?to=http://other.test/hello"))
line("bytes", lambda: len(urllib.request.urlopen("http://plain.test/bytes?n=4194304", timeout=20).read()))
line("raw-server", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10))
line("raw-out", lambda: socket.create_connection(("192.0.2.1", 80), timeout=10))
line("dns", lambda: socket.getaddrinfo("files.test", 443))
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05files\x04test\x00\x00\x01\x00\x01", ("192.0.2.53", 53))
    return u.recv(512)
line("dns-udp", udp)
`
	spec := netSpec(py(code), files, env, "files.test", "plain.test", "rebind.test", "inner.test")
	spec.Args = []string{strings.Split(srv.PlainAddr(), ":")[1]}
	res := egressJob(t, rt, "acme", spec, th, func(c *egress.Config) { c.MaxBytes = 1 << 20 })
	if res.Status != job.StatusSucceeded {
		t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		what, rest, _ := strings.Cut(l, " ")
		got[what] = rest
	}
	for what, want := range map[string]string{
		"not-allowed":     "not in this job's allowlist",
		"not-allowed-tls": "403",
		"rebind":          "resolves to 127.0.0.1",
		"private":         "resolves to 10.1.2.3",
		"ip-literal":      "not in this job's allowlist",
		"sni":             "err",
		"redirect":        "not in this job's allowlist",
		"bytes":           "err",
		"raw-server":      "ConnectionRefusedError",
		"raw-out":         "err",
		"dns":             "gaierror",
		"dns-udp":         "err",
	} {
		l, ok := got[what]
		if !ok || !strings.HasPrefix(l, "err ") || !strings.Contains(l, want) {
			t.Errorf("%s: %q, want a failure saying %q", what, l, want)
			continue
		}
		if f := strings.Fields(l); len(f) < 2 || seconds(f[1]) > 5 {
			t.Errorf("%s: %q, want a failure within 5 s", what, l)
		}
	}
	e := res.Egress
	if e == nil {
		t.Fatal("no egress account")
	}
	reasons := map[string]string{}
	for _, r := range e.Records {
		if !r.Allowed {
			reasons[r.Host] += r.Reason + "; "
		}
	}
	for host, want := range map[string]string{"other.test": "allowlist", "rebind.test": "127.0.0.1", "inner.test": "10.1.2.3",
		"127.0.0.1": "allowlist", "files.test": "TLS server name"} {
		if !strings.Contains(reasons[host], want) {
			t.Errorf("no refused record of %s saying %q: %v", host, want, reasons)
		}
	}
	var capped bool
	for _, r := range e.Records {
		capped = capped || (r.Host == "plain.test" && strings.Contains(r.Reason, "byte"))
	}
	if !capped {
		b, _ := json.MarshalIndent(e.Records, "", " ")
		t.Errorf("no record of the byte cap:\n%s", b)
	}
	if srv.Requests.Load() > 2 {
		t.Errorf("the test server answered %d requests; only the redirect and the capped download may reach it", srv.Requests.Load())
	}
}

// One job's allowlist never widens another's: jobs of one tenant with
// different policies, one after another in one box and at once.
func TestEgressAllowlistsArePerJob(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	_, th, files, env := egressSetup(t, "")
	spec := py(`
import urllib.request
for u in ("http://plain.test/hello", "https://files.test/hello"):
    try:
        print("ok", urllib.request.urlopen(u, timeout=20).read().decode())
    except Exception as e:
        print("refused", u)
`)
	onlyFiles := netSpec(spec, files, env, "files.test")
	onlyPlain := netSpec(spec, files, env, "plain.test")
	check := func(res job.Result, want string) {
		t.Helper()
		if res.Status != job.StatusSucceeded || res.Stdout != want {
			t.Errorf("%s %+v\n%s\nwant:\n%s\n%s", res.Status, res.Error, res.Stdout, want, res.Stderr)
		}
	}
	wantFiles := "refused http://plain.test/hello\nok hello from files.test\n"
	wantPlain := "ok hello from plain.test\nrefused https://files.test/hello\n"
	for range 2 {
		check(egressJob(t, rt, "acme", onlyFiles, th, nil), wantFiles)
		check(egressJob(t, rt, "acme", onlyPlain, th, nil), wantPlain)
	}
	// At once, on two boxes: each job waits at the test server until the
	// other is there too, so both run at the same time; each reaches its
	// own host and is refused the other's.
	at := func(allow, own, other string) job.Spec {
		return netSpec(py(fmt.Sprintf(`
import urllib.request
print("ok", urllib.request.urlopen(%q, timeout=40).read().decode())
try:
    urllib.request.urlopen(%q, timeout=20)
    print("reached", %q)
except Exception as e:
    print("refused", %q)
`, own, other, other, other)), files, env, allow)
	}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if i == 0 {
				check(egressJob(t, rt, "acme", at("files.test", "https://files.test/barrier?key=b&n=2", "http://plain.test/hello"), th, nil),
					"ok met\nrefused http://plain.test/hello\n")
			} else {
				check(egressJob(t, rt, "acme", at("plain.test", "http://plain.test/barrier?key=b&n=2", "https://files.test/hello"), th, nil),
					"ok met\nrefused https://files.test/hello\n")
			}
		})
	}
	wg.Wait()
}

// Node's fetch goes through the job's proxy too.
func TestEgressNodeFetch(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	_, th, files, env := egressSetup(t, "")
	spec := js(`
(async () => {
  for (const u of ["https://files.test/hello", "https://other.test/hello"]) {
    try { const r = await fetch(u); console.log("ok", await r.text()); }
    catch (e) { console.log("err", String(e.cause || e)); }
  }
})();
`)
	res := egressJob(t, rt, "acme", netSpec(spec, files, env, "files.test"), th, nil)
	if res.Status != job.StatusSucceeded {
		t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 2 || lines[0] != "ok hello from files.test" || !strings.Contains(lines[1], "not in this job's allowlist") {
		t.Fatalf("stdout:\n%s\n%s", res.Stdout, res.Stderr)
	}
	if e := res.Egress; e == nil || e.Connections != 2 || e.Refused != 1 {
		t.Fatalf("egress account %+v", e)
	}
}

// A session with a network: its proxy listener lives in the interpreter's
// namespace across calls, each call accounts for its own connections, and
// an interpreter that ends takes its listener along; the next one gets a
// new one.
func TestEgressInASession(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	_, th, files, env := egressSetup(t, "")
	s := openSession(t, rt, "acme", 0)
	exec := func(code string) (job.Result, CallInfo) {
		t.Helper()
		spec := netSpec(job.Spec{Code: code}, files, env, "files.test")
		hook := func(ctx context.Context, ln net.Listener) *job.Egress {
			p := egress.New(egress.Config{Allow: egressrule.Rules{{Host: "files.test"}}, TestHosts: th})
			if err := p.Serve(ctx, ln); err != nil {
				t.Errorf("Serve: %v", err)
			}
			return p.Egress()
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		res, info, err := s.Exec(ctx, Request{ID: job.NewID(), Spec: spec, Tenant: "acme", Network: serveFunc(hook)})
		if err != nil {
			t.Fatalf("Exec: %v (result %+v)", err, res)
		}
		return res, info
	}
	fetch := `
import urllib.request
def fetch(u):
    try:
        return "ok " + urllib.request.urlopen(u, timeout=20).read().decode()
    except Exception as e:
        return "refused %s" % e
print(fetch(URL))
`
	account := func(res job.Result, conns, refused int) {
		t.Helper()
		if e := res.Egress; e == nil || e.Connections != conns || e.Refused != refused {
			t.Fatalf("call's egress %+v, want %d connections, %d refused\n%s", res.Egress, conns, refused, res.Stderr)
		}
	}
	res, info := exec("URL = 'https://files.test/hello'" + fetch)
	mustSucceed(t, res, "ok hello from files.test")
	account(res, 1, 0)
	if !info.Fresh {
		t.Fatalf("first call: %+v", info)
	}
	res, _ = exec("print(fetch('http://plain.test/hello').split(':')[0])")
	mustSucceed(t, res, "refused HTTP Error 403")
	account(res, 1, 1)
	res, _ = exec("print(fetch('https://files.test/hello'))")
	mustSucceed(t, res, "ok hello from files.test")
	account(res, 1, 0)
	// The interpreter ends; the next call's interpreter has a network too.
	if res, info = exec("import os; os._exit(3)"); !info.Ended {
		t.Fatalf("os._exit: %+v %s", info, res.Status)
	}
	res, info = exec("URL = 'https://files.test/hello'" + fetch)
	mustSucceed(t, res, "ok hello from files.test")
	account(res, 1, 0)
	if !info.Fresh {
		t.Fatalf("after the interpreter ended: %+v", info)
	}
}

// A request whose Network offers none (nil, or NoNetwork) refuses a job or
// a session call asking for a network, as an invalid request, before
// anything of it runs.
func TestEgressRefusedWithoutANetwork(t *testing.T) {
	t.Parallel()
	rt := setupSessions(t)
	spec := netSpec(py("print('ran')"), nil, nil, "files.test")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	refused := func(what string, res job.Result, err error) {
		t.Helper()
		if !errors.Is(err, errNoEgress) || res.Status != job.StatusFailed || res.Error == nil ||
			res.Error.Category != job.CategoryInvalidRequest || strings.Contains(res.Stdout, "ran") {
			t.Errorf("%s: %v %s %+v %q; want refused as an invalid request before it ran", what, err, res.Status, res.Error, res.Stdout)
		}
	}
	for _, n := range []Network{nil, NoNetwork{}} {
		res, err := rt.Run(ctx, Request{ID: job.NewID(), Spec: spec, Tenant: "acme", Network: n})
		refused(fmt.Sprintf("job, network %T", n), res, err)
	}
	s := openSession(t, rt, "acme", 0)
	res, _, err := s.Exec(ctx, Request{ID: job.NewID(), Spec: job.Spec{Code: "print('ran')", Network: spec.Network}, Tenant: "acme", Network: NoNetwork{}})
	refused("session call", res, err)
}
