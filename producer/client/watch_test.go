package client_test

import (
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/producer/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// watched is an HTTP transport that tells a test, as they happen, what each
// of its client's requests got: a status code, or 0 when no answer came
// (the connection was refused or cut).
type watched struct {
	base    http.RoundTripper
	answers chan int
}

func newWatched() *watched {
	return &watched{base: http.DefaultTransport, answers: make(chan int, 1024)}
}

// option makes a client send its requests through w.
func (w *watched) option() client.Option {
	return client.WithHTTPClient(&http.Client{Transport: w})
}

func (w *watched) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := w.base.RoundTrip(r)
	code := 0
	if err == nil {
		code = resp.StatusCode
	}
	select {
	case w.answers <- code:
	default: // the test stopped listening
	}
	return resp, err
}

// await waits until n requests got the answer code (0: none).
func (w *watched) await(t *testing.T, code, n int, what string) {
	t.Helper()
	for n > 0 {
		if testkit.Receive(t, w.answers, 30*time.Second, what) == code {
			n--
		}
	}
}
