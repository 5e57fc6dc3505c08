package egresstest

import (
	"crypto/tls"
	"io"
	"net/http"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The TLS server's certificate is trusted through CertPool for its names,
// and the barrier answers only once n clients wait at it.
func TestServerAnswersForItsNames(t *testing.T) {
	s := New(t, "files.test")
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.CertPool(), ServerName: "files.test"}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(u string) (int, string) {
		t.Helper()
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("https://" + s.TLSAddr() + "/hello"); code != 200 || body != "hello from 127.0.0.1" {
		t.Fatalf("hello: %d %q", code, body)
	}
	if code, body := get("http://" + s.PlainAddr() + "/bytes?n=100000"); code != 200 || len(body) != 100000 {
		t.Fatalf("bytes: %d %d", code, len(body))
	}
	var wg sync.WaitGroup
	got := make([]string, 2)
	for i := range 2 {
		wg.Go(func() { _, got[i] = get("http://" + s.PlainAddr() + "/barrier?key=k&n=2") })
	}
	wg.Wait()
	if got[0] != "met" || got[1] != "met" {
		t.Fatalf("barrier: %q", got)
	}
	if s.Requests.Load() != 4 {
		t.Fatalf("requests counted: %d, want 4", s.Requests.Load())
	}
}
