package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

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
	c, err := client.New("http://"+h.addr, client.WithAPIKey(sdkAPIKey))
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
	for { // the restart must fall while the job runs
		v, err := c.Get(ctx, one.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != job.StatusQueued {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
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
	time.Sleep(500 * time.Millisecond) // let the long-polls start
	h.stopAPI()
	time.Sleep(2 * time.Second)
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
