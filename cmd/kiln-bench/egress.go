package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kilnrun/kiln/internal/egresstest"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/worker/egress"
)

// The egress section: what a job's egress proxy (worker/egress) adds to a
// request and to a download, against the same request made directly, both
// to a loopback test server (internal/egresstest) by a Go client that
// opens a new connection each time. The proxy runs as a worker runs it for
// one job: an allowlist, the test name table (no DNS), records kept. Run
// it alone with `kiln-bench -only egress`.

const (
	rowEgressDirect      = "egress http, direct"
	rowEgressProxy       = "egress http, proxy"
	rowEgressTLSDirect   = "egress https, direct"
	rowEgressTLSProxy    = "egress https, tunnel"
	rowEgressBulkDirect  = "egress 10 MB https, direct"
	rowEgressBulkProxy   = "egress 10 MB https, tunnel"
	egressBulkBytes      = 10 << 20
	egressBenchMaxConns  = 1 << 30
	egressBenchMaxBytes  = 1 << 62
	egressBenchHostPlain = "plain.bench.test"
	egressBenchHostTLS   = "files.bench.test"
)

func init() {
	register(section{
		Name:  "egress",
		Order: 18,
		Setup: egressRows,
		Ratios: []ratio{
			{rowEgressProxy, rowEgressDirect}, {rowEgressTLSProxy, rowEgressTLSDirect}, {rowEgressBulkProxy, rowEgressBulkDirect},
		},
		Report: egressReport,
	})
}

func egressRows(ctx context.Context, _ *options) ([]row, func(), error) {
	srv, err := egresstest.Start(egressBenchHostTLS)
	if err != nil {
		return nil, nil, err
	}
	th, err := egress.ParseTestHosts(srv.Hosts(egressBenchHostTLS, egressBenchHostPlain))
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	rules, err := egressrule.ParseRules(egressBenchHostTLS + "," + egressBenchHostPlain)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, nil, fmt.Errorf("egress: %w", err)
	}
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	// One proxy for every run, as one job's proxy serves all its
	// connections; its caps are lifted so that the runs never reach them.
	p := egress.New(egress.Config{Allow: rules, TestHosts: th, MaxConns: egressBenchMaxConns, MaxBytes: egressBenchMaxBytes})
	served := make(chan struct{})
	go func() { _ = p.Serve(pctx, ln); close(served) }()
	cleanup := func() { stop(); <-served; srv.Close() }

	proxyURL := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	tlsConf := &tls.Config{RootCAs: srv.CertPool()}
	direct := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConf,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// The names map to the test servers, as the proxy maps them.
			target := srv.PlainAddr()
			if _, port, _ := net.SplitHostPort(addr); port == "443" {
				target = srv.TLSAddr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, target)
		}}}
	proxied := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConf, Proxy: http.ProxyURL(proxyURL)}}
	get := func(c *http.Client, u string, want int64) func(context.Context) error {
		return func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return err
			}
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK || (want > 0 && n != want) {
				return fmt.Errorf("GET %s: %d, %d bytes", u, resp.StatusCode, n)
			}
			return nil
		}
	}
	hello := "http://" + egressBenchHostPlain + "/hello"
	helloTLS := "https://" + egressBenchHostTLS + "/hello"
	bulk := fmt.Sprintf("https://%s/bytes?n=%d", egressBenchHostTLS, egressBulkBytes)
	return []row{
		{rowEgressDirect, get(direct, hello, 0)},
		{rowEgressProxy, get(proxied, hello, 0)},
		{rowEgressTLSDirect, get(direct, helloTLS, 0)},
		{rowEgressTLSProxy, get(proxied, helloTLS, 0)},
		{rowEgressBulkDirect, get(direct, bulk, egressBulkBytes)},
		{rowEgressBulkProxy, get(proxied, bulk, egressBulkBytes)},
	}, cleanup, nil
}

func egressReport(_ context.Context, _ *options, medians map[string]time.Duration) {
	added := func(num, den string) string {
		n, okN := medians[num]
		d, okD := medians[den]
		if !okN || !okD {
			return "n/a"
		}
		return fmt.Sprintf("%+.2f ms", float64(n-d)/float64(time.Millisecond))
	}
	rate := func(name string) string {
		d, ok := medians[name]
		if !ok || d <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.0f MB/s", float64(egressBulkBytes)/d.Seconds()/1e6)
	}
	fmt.Printf("\negress proxy, added per request: http %s, https tunnel %s; 10 MB download: %s through the tunnel, %s direct\n",
		added(rowEgressProxy, rowEgressDirect), added(rowEgressTLSProxy, rowEgressTLSDirect), rate(rowEgressBulkProxy), rate(rowEgressBulkDirect))
}
