package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/internal/netguard"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
)

// Defaults of Config.
const (
	MaxConnsDefault     = 64
	MaxBytesDefault     = 256 << 20
	ConnTimeoutDefault  = 5 * time.Minute
	headerTimeout       = 10 * time.Second
	dialTimeout         = 10 * time.Second
	maxRefusalBodyBytes = 1 << 10
)

// Resolver resolves host names (net.DefaultResolver in production).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config is one job's proxy.
type Config struct {
	Allow egressrule.Rules
	// Resolver resolves the names the program asks for; nil:
	// net.DefaultResolver.
	Resolver Resolver
	// Dial dials the checked address; nil: a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// AllowNets are networks allowed besides public unicast addresses (an
	// operator's internal services; loopback in tests). Every other
	// resolved address that netguard does not call public is refused.
	AllowNets []netip.Prefix
	// MaxConns bounds the connections the job may open, refused ones
	// included; MaxBytes the bytes of all of them, both ways; ConnTimeout
	// each one's life. Zero: the defaults.
	MaxConns    int
	MaxBytes    int64
	ConnTimeout time.Duration
	// TestHosts, for tests only, replaces DNS with a fixed table and maps
	// names to servers the test started (see TestHosts); it overrides
	// Resolver.
	TestHosts *TestHosts
	// Now is the clock of the records (time.Now when nil).
	Now func() time.Time
	// OnRecord is called with every connection's record as it ends.
	OnRecord func(Record)
	Log      *slog.Logger
}

// Record is one connection the job asked for: what it named, where the
// proxy connected, how much went each way, and why it was refused.
type Record = job.EgressRecord

// Proxy is one job's egress proxy: HTTP CONNECT (for TLS) and plain HTTP
// requests in absolute form, each checked against the job's allowlist,
// resolved by the proxy, refused when any resolved address is not public,
// and recorded.
type Proxy struct {
	cfg Config

	conns atomic.Int64 // connections asked for
	bytes atomic.Int64 // both ways, all connections

	mu      sync.Mutex
	summary job.Egress // sums of every record, the records up to job.MaxEgressRecords
}

// New returns a proxy for cfg.
func New(cfg Config) *Proxy {
	switch {
	case cfg.TestHosts != nil:
		cfg.Resolver = cfg.TestHosts
	case cfg.Resolver == nil:
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: dialTimeout}
		cfg.Dial = d.DialContext
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = MaxConnsDefault
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = MaxBytesDefault
	}
	if cfg.ConnTimeout <= 0 {
		cfg.ConnTimeout = ConnTimeoutDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{cfg: cfg}
}

// Serve accepts connections on ln until ctx ends or ln is closed, and
// returns once every connection it accepted has ended.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("egress: accept: %w", err)
		}
		wg.Go(func() { p.handle(ctx, c) })
	}
}

// Records returns the records of the connections that ended so far, the
// first job.MaxEgressRecords of them (a job that hammers its proxy holds
// no more memory than that).
func (p *Proxy) Records() []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Record(nil), p.summary.Records...)
}

// Egress is the job's result's account of its connections: their sums,
// and the records themselves up to job.MaxEgressRecords.
func (p *Proxy) Egress() *job.Egress {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.summary
	e.Records = append([]Record(nil), e.Records...)
	return &e
}

// CapRefusal reports whether r is a connection refused because the job
// had opened all the connections it may (Config.MaxConns).
func (p *Proxy) CapRefusal(r Record) bool { return !r.Allowed && r.Reason == p.capReason() }

func (p *Proxy) capReason() string {
	return fmt.Sprintf("kiln egress: this job may open at most %d connections", p.cfg.MaxConns)
}

func (p *Proxy) record(r Record, start time.Time) {
	r.DurationMS = p.cfg.Now().Sub(start).Milliseconds()
	p.mu.Lock()
	e := &p.summary
	e.Connections++
	if !r.Allowed {
		e.Refused++
	}
	e.BytesUp += r.BytesUp
	e.BytesDown += r.BytesDown
	if len(e.Records) < job.MaxEgressRecords {
		e.Records = append(e.Records, r)
	} else {
		e.RecordsDropped++
	}
	p.mu.Unlock()
	if p.cfg.OnRecord != nil {
		p.cfg.OnRecord(r)
	}
}

// refusal is a connection refused before it reached anything: the program
// gets an HTTP error it (and a model reading its output) can act on.
type refusal struct {
	status int
	reason string
}

func (e *refusal) Error() string { return e.reason }

func refuse(status int, format string, args ...any) error {
	return &refusal{status: status, reason: fmt.Sprintf(format, args...)}
}

// handle serves one connection from the job: one CONNECT tunnel or one
// plain HTTP request.
func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	start := p.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return // not HTTP: nothing was asked for
	}
	_ = c.SetReadDeadline(time.Time{})
	rec := Record{Time: start, Method: req.Method}
	up, err := p.open(ctx, req, &rec)
	if err != nil {
		rec.Reason = err.Error()
		var r *refusal
		if errors.As(err, &r) {
			writeRefusal(c, r)
		} else {
			writeRefusal(c, &refusal{status: http.StatusBadGateway, reason: err.Error()})
		}
		p.record(rec, start)
		return
	}
	defer up.Close()
	rec.Allowed = true
	in := &meter{Reader: br, p: p, n: &rec.BytesUp}
	if req.Method == http.MethodConnect {
		err = p.tunnel(ctx, c, in, up, &rec)
	} else {
		err = p.forward(c, in, up, req, &rec)
	}
	if err != nil && rec.Reason == "" {
		rec.Reason = err.Error()
	}
	p.record(rec, start)
}

// open checks what req asks for and connects to it.
func (p *Proxy) open(ctx context.Context, req *http.Request, rec *Record) (net.Conn, error) {
	if n := p.conns.Add(1); n > int64(p.cfg.MaxConns) {
		return nil, &refusal{status: http.StatusTooManyRequests, reason: p.capReason()}
	}
	var hostport string
	switch {
	case req.Method == http.MethodConnect:
		hostport = req.Host
	case req.URL.Scheme == "http" && req.URL.Host != "":
		hostport = req.URL.Host
		if req.URL.Port() == "" {
			hostport = net.JoinHostPort(req.URL.Hostname(), "80")
		}
	default:
		return nil, refuse(http.StatusBadRequest, "kiln egress: send CONNECT host:port (https) or an absolute http:// URL through the proxy")
	}
	host, portStr, err := net.SplitHostPort(hostport)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		return nil, refuse(http.StatusBadRequest, "kiln egress: %q is not host:port", hostport)
	}
	rec.Host, rec.Port = egressrule.NormalHost(host), port
	if !p.cfg.Allow.Allows(host, port) {
		allowed := p.cfg.Allow.String()
		if allowed == "" {
			allowed = "none"
		}
		return nil, refuse(http.StatusForbidden, "kiln egress: %s:%d is not in this job's allowlist (allowed: %s)", rec.Host, port, allowed)
	}
	if ap, ok := p.cfg.TestHosts.server(rec.Host); ok {
		return p.dial(ctx, ap.String(), rec)
	}
	addrs, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", rec.Host)
	if err != nil || len(addrs) == 0 {
		return nil, refuse(http.StatusBadGateway, "kiln egress: cannot resolve %s: %v", rec.Host, err)
	}
	// Checked after resolution, every address: a name that resolves to
	// an internal address (DNS rebinding, a metadata service) is refused.
	for _, a := range addrs {
		if why := netguard.Why(a, p.cfg.AllowNets); why != "" {
			return nil, refuse(http.StatusForbidden, "kiln egress: %s resolves to %s, %s", rec.Host, a.Unmap(), why)
		}
	}
	return p.dial(ctx, netip.AddrPortFrom(addrs[0].Unmap(), uint16(port)).String(), rec)
}

// dial connects to the checked address addr.
func (p *Proxy) dial(ctx context.Context, addr string, rec *Record) (net.Conn, error) {
	rec.Addr = addr
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	up, err := p.cfg.Dial(dctx, "tcp", addr)
	if err != nil {
		return nil, refuse(http.StatusBadGateway, "kiln egress: connect to %s (%s): %v", rec.Host, addr, err)
	}
	return up, nil
}

// tunnel answers CONNECT, then requires a TLS ClientHello whose server
// name is the name the tunnel was asked for, and relays both ways.
func (p *Proxy) tunnel(ctx context.Context, c net.Conn, in *meter, up net.Conn, rec *Record) error {
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	hello, sni, err := readClientHello(in)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		rec.Allowed = false
		rec.Reason = "kiln egress: a tunnel must start with a TLS ClientHello: " + err.Error()
		return nil
	}
	if egressrule.NormalHost(sni) != rec.Host {
		rec.Allowed = false
		rec.Reason = fmt.Sprintf("kiln egress: the TLS server name %q is not the tunnel's host %s", sni, rec.Host)
		return nil
	}
	if _, err := up.Write(hello); err != nil {
		return err
	}
	out := &meter{Reader: up, p: p, n: &rec.BytesDown}
	return p.relay(ctx, c, in, up, out, rec)
}

// forward sends one plain HTTP request upstream (origin form, no hop-by-hop
// headers, the connection closed after it) and relays the answer.
func (p *Proxy) forward(c net.Conn, in *meter, up net.Conn, req *http.Request, rec *Record) error {
	if egressrule.NormalHost(req.URL.Hostname()) != rec.Host {
		return errors.New("kiln egress: inconsistent request target")
	}
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		req.Header.Del(h)
	}
	req.Close = true
	req.Host = req.URL.Host
	req.Body = io.NopCloser(io.LimitReader(&meterBody{m: in, body: req.Body}, p.cfg.MaxBytes))
	if err := req.Write(up); err != nil {
		return fmt.Errorf("kiln egress: send the request: %w", err)
	}
	out := &meter{Reader: up, p: p, n: &rec.BytesDown}
	if _, err := io.Copy(c, out); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	if out.over {
		rec.Reason = fmt.Sprintf("kiln egress: cut at the job's %d bytes", p.cfg.MaxBytes)
	}
	return nil
}

// relay copies both ways until either side ends, the byte budget runs
// out, or ctx ends.
func (p *Proxy) relay(ctx context.Context, c net.Conn, in *meter, up net.Conn, out *meter, rec *Record) error {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, in)
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, out)
		closeWrite(c)
		done <- struct{}{}
	}()
	ended := 0
wait:
	for ended < 2 {
		select {
		case <-done:
			ended++
		case <-ctx.Done():
			break wait
		}
	}
	c.Close()
	up.Close()
	// Closed, both copies end: what they counted (rec's bytes, the
	// meters' over) is read only after.
	for ; ended < 2; ended++ {
		<-done
	}
	if in.over || out.over {
		rec.Reason = fmt.Sprintf("kiln egress: cut at the job's %d bytes", p.cfg.MaxBytes)
	} else if ctx.Err() != nil {
		rec.Reason = "kiln egress: the connection outlived its time limit"
	}
	return nil
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// meter counts bytes into n and stops at the proxy's byte budget.
type meter struct {
	io.Reader
	p    *Proxy
	n    *int64
	over bool
}

func (m *meter) Read(b []byte) (int, error) {
	if m.p.bytes.Load() >= m.p.cfg.MaxBytes {
		m.over = true
		return 0, io.EOF
	}
	n, err := m.Reader.Read(b)
	atomic.AddInt64(m.n, int64(n))
	m.p.bytes.Add(int64(n))
	return n, err
}

// meterBody reads a request body (already framed by net/http) and counts
// it as the client's.
type meterBody struct {
	m    *meter
	body io.ReadCloser
}

func (b *meterBody) Read(p []byte) (int, error) {
	if b.body == nil || b.body == http.NoBody {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	atomic.AddInt64(b.m.n, int64(n))
	b.m.p.bytes.Add(int64(n))
	return n, err
}

// writeRefusal answers a refused request with a short plain-text error.
func writeRefusal(c net.Conn, r *refusal) {
	body := r.reason
	if len(body) > maxRefusalBodyBytes {
		body = body[:maxRefusalBodyBytes]
	}
	body += "\n"
	_ = c.SetWriteDeadline(time.Now().Add(headerTimeout))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Kiln-Egress: refused\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		r.status, http.StatusText(r.status), len(body), body)
}

// errHelloRead ends the TLS handshake once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// readClientHello reads the TLS ClientHello from r and returns its bytes
// (to replay upstream) and its server name.
func readClientHello(r io.Reader) ([]byte, string, error) {
	rc := &recordingConn{r: r}
	var sni string
	err := tls.Server(rc, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni = h.ServerName
		return nil, errHelloRead
	}}).Handshake()
	if !errors.Is(err, errHelloRead) {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return nil, "", err
	}
	if sni == "" {
		return nil, "", errors.New("the ClientHello names no server (SNI)")
	}
	return rc.buf, sni, nil
}

// recordingConn is a read-only net.Conn over r that keeps what was read.
type recordingConn struct {
	r   io.Reader
	buf []byte
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.buf = append(c.buf, b[:n]...)
	return n, err
}
func (c *recordingConn) Write(b []byte) (int, error)      { return 0, errors.New("read-only") }
func (c *recordingConn) Close() error                     { return nil }
func (c *recordingConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *recordingConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *recordingConn) SetDeadline(time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }
