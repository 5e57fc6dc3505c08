package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// goClientSuite is the Go client's share of the SDK acceptance: against the
// whole pipeline, Wait and WaitAll carry on across an API restart that
// happens while the jobs run in their sandboxes, and problem types match
// their sentinels.
func goClientSuite(t *testing.T, h *sdkHarness) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	watch := &watchedTransport{base: http.DefaultTransport, longPolls: make(chan string, 256), failed: make(chan string, 256)}
	c, err := client.New("http://"+h.addr, client.WithAPIKey(sdkAPIKey), client.WithHTTPClient(&http.Client{Transport: watch}))
	if err != nil {
		t.Fatal(err)
	}
	noCache := job.CacheOff()
	one, err := c.Submit(ctx, job.Spec{Code: "import time\ntime.sleep(4)\nprint('survived')", Cache: noCache})
	if err != nil {
		t.Fatal(err)
	}
	var more []string
	for _, code := range []string{"print('a')", "import time\ntime.sleep(3)\nprint('b')"} {
		sub, err := c.Submit(ctx, job.Spec{Code: code, Cache: noCache})
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, sub.ID)
	}
	// The restart must fall while the job runs.
	testkit.Eventually(t, time.Minute, "job "+one.ID+" to leave the queue", func() bool {
		v, err := c.Get(ctx, one.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		return v.Status != job.StatusQueued
	})
	type answer struct {
		views []client.JobView
		err   error
		at    time.Time
	}
	waited, waitedAll := make(chan answer, 1), make(chan answer, 1)
	go func() {
		v, err := c.Wait(ctx, one.ID)
		waited <- answer{[]client.JobView{v}, err, time.Now()}
	}()
	go func() {
		vs, err := c.WaitAll(ctx, more)
		waitedAll <- answer{vs, err, time.Now()}
	}()
	// Both waits are in a long-poll when the API goes, and both find it
	// gone (a request of each fails) before it comes back.
	watch.await(t, watch.longPolls, "the long-polls of Wait and WaitAll", one.ID, more...)
	h.stopAPI()
	watch.await(t, watch.failed, "a failed request of Wait and of WaitAll", one.ID, more...)
	if err := h.startAPI(); err != nil {
		t.Fatal(err)
	}
	upAgain := time.Now()

	a := <-waited
	if a.err != nil || a.views[0].Status != job.StatusSucceeded || a.views[0].Stdout != "survived\n" {
		t.Fatalf("Wait across an API restart: %+v %v", a.views, a.err)
	}
	if a.at.Before(upAgain) {
		t.Fatalf("Wait returned at %v, before the API was back (%v): the restart did not fall within the wait", a.at, upAgain)
	}
	b := <-waitedAll
	if b.err != nil || len(b.views) != 2 {
		t.Fatalf("WaitAll across an API restart: %+v %v", b.views, b.err)
	}
	for i, want := range []string{"a\n", "b\n"} {
		if v := b.views[i]; v.ID != more[i] || v.Status != job.StatusSucceeded || v.Stdout != want {
			t.Errorf("WaitAll job %d: %s %s %q (want %s succeeded %q)", i, v.ID, v.Status, v.Stdout, more[i], want)
		}
	}

	anon, _ := client.New("http://" + h.addr)
	if _, err := anon.Runtimes(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("no API key: %v (want ErrUnauthorized)", err)
	}
	if _, err := c.Get(ctx, job.NewID(), 0); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("unknown job: %v (want ErrNotFound)", err)
	}
}

// watchedTransport tells a test which jobs its client long-polls and which
// requests got no answer (the API was down), as they happen.
type watchedTransport struct {
	base      http.RoundTripper
	longPolls chan string // the path of each long-poll sent
	failed    chan string // the path of each request that failed
}

func (w *watchedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Has("wait") {
		notify(w.longPolls, r.URL.String())
	}
	resp, err := w.base.RoundTrip(r)
	if err != nil {
		notify(w.failed, r.URL.String())
	}
	return resp, err
}

func notify(ch chan<- string, s string) {
	select {
	case ch <- s:
	default: // a test that stopped listening
	}
}

// await receives from ch until it has seen a request about first and one
// about any of rest.
func (w *watchedTransport) await(t *testing.T, ch <-chan string, what, first string, rest ...string) {
	t.Helper()
	var sawFirst, sawRest bool
	for !sawFirst || !sawRest {
		u := testkit.Receive(t, ch, 30*time.Second, what)
		sawFirst = sawFirst || strings.Contains(u, first)
		for _, id := range rest {
			sawRest = sawRest || strings.Contains(u, id)
		}
	}
}
