package egresstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server answers for its names over TLS (TLS) and plain HTTP (Plain):
//
//	/hello          "hello from <host>"
//	/bytes?n=N      N bytes of 'x'
//	/redirect?to=U  302 to U
//	/barrier?key=K&n=N  answers "met" once N requests with key K are
//	                waiting (so N clients are provably at it at once);
//	                504 after 30 s
type Server struct {
	TLS, Plain *httptest.Server
	// CAPEM is the certificate of the authority that signed TLS's
	// certificate (for SSL_CERT_FILE and friends).
	CAPEM []byte
	// Requests counts the requests either server answered.
	Requests atomic.Int64

	mu       sync.Mutex
	barriers map[string]*barrier
}

type barrier struct {
	waiting int
	met     chan struct{}
}

// meet waits until n requests with key are waiting, or until timeout.
func (s *Server) meet(key string, n int, timeout time.Duration) bool {
	s.mu.Lock()
	if s.barriers == nil {
		s.barriers = map[string]*barrier{}
	}
	b := s.barriers[key]
	if b == nil {
		b = &barrier{met: make(chan struct{})}
		s.barriers[key] = b
	}
	b.waiting++
	if b.waiting == n {
		close(b.met)
	}
	s.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-b.met:
		return true
	case <-t.C:
		return false
	}
}

// New starts both servers for names (the certificate's DNS names) and
// stops them when t ends.
func New(t testing.TB, names ...string) *Server {
	t.Helper()
	s, err := Start(names...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Close stops both servers.
func (s *Server) Close() { s.TLS.Close(); s.Plain.Close() }

// Start starts both servers for names; Close stops them.
func Start(names ...string) (*Server, error) {
	s := &Server{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Requests.Add(1)
		switch r.URL.Path {
		case "/hello":
			fmt.Fprintf(w, "hello from %s", strings.Split(r.Host, ":")[0])
		case "/bytes":
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Length", strconv.Itoa(n))
			chunk := []byte(strings.Repeat("x", 64<<10))
			for n > 0 {
				k := min(n, len(chunk))
				if _, err := w.Write(chunk[:k]); err != nil {
					return
				}
				n -= k
			}
		case "/redirect":
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
		case "/barrier":
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			if !s.meet(r.URL.Query().Get("key"), n, 30*time.Second) {
				http.Error(w, "barrier not met", http.StatusGatewayTimeout)
				return
			}
			io.WriteString(w, "met")
		default:
			http.NotFound(w, r)
		}
	})
	caCert, caKey, caPEM, err := newCA()
	if err != nil {
		return nil, err
	}
	leaf, err := newLeaf(caCert, caKey, names)
	if err != nil {
		return nil, err
	}
	s.CAPEM = caPEM
	s.TLS = httptest.NewUnstartedServer(h)
	s.TLS.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	s.TLS.StartTLS()
	s.Plain = httptest.NewServer(h)
	return s, nil
}

// CertPool trusts the servers' authority (for Go clients).
func (s *Server) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(s.CAPEM)
	return p
}

// TLSAddr and PlainAddr are the servers' host:port on loopback.
func (s *Server) TLSAddr() string   { return s.TLS.Listener.Addr().String() }
func (s *Server) PlainAddr() string { return s.Plain.Listener.Addr().String() }

// Hosts is the --egress-test-hosts value mapping name to the TLS server
// and plainName to the plain one.
func (s *Server) Hosts(name, plainName string) string {
	out := name + "=" + s.TLSAddr()
	if plainName != "" {
		out += "," + plainName + "=" + s.PlainAddr()
	}
	return out
}

func newCA() (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("egresstest: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kiln egress test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("egresstest: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("egresstest: CA certificate: %w", err)
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func newLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, names []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("egresstest: key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("egresstest: certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
