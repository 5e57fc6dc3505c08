package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

func TestNewRejectsBadBaseURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
}

func TestClientAgainstRealAPI(t *testing.T) {
	t.Parallel()
	e := startEnv(t, map[string]string{"key-1": "tests"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	anon, err := client.New(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = anon.Submit(ctx, job.Spec{Code: "print(1)"})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized || apiErr.Type != "urn:kiln:problem:unauthorized" {
		t.Fatalf("without key: %v", err)
	}

	c, err := client.New(e.URL+"/", client.WithAPIKey("key-1"), client.WithHTTPClient(&http.Client{}))
	if err != nil {
		t.Fatal(err)
	}
	rts, err := c.Runtimes(ctx)
	if err != nil || len(rts) != 1 || rts[0].Name != "python" {
		t.Fatalf("Runtimes: %v %v", rts, err)
	}

	// Submit with wait: a worker finishes the job during the long-poll.
	done := make(chan error, 1)
	go func() { done <- e.work(ctx, "out\n", 3) }()
	sub, err := c.Submit(ctx, job.Spec{Code: "import sys; print('out'); sys.exit(3)"}, client.WithWait(20*time.Second), client.WithIdempotencyKey("idem-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sub.Accepted || !sub.Terminal() || sub.Status != job.StatusFailed || sub.Code() != 3 || sub.Stdout != "out\n" {
		t.Fatalf("submission: %+v", sub)
	}
	got, err := c.Get(ctx, sub.ID, 0)
	if err != nil || got.ID != sub.ID || got.Worker != "example-worker" || got.Links == nil {
		t.Fatalf("Get: %+v %v", got, err)
	}
	// Same key, other spec: 422 naming the header.
	_, err = c.Submit(ctx, job.Spec{Code: "print(2)"}, client.WithIdempotencyKey("idem-1"))
	if !errors.As(err, &apiErr) || apiErr.Status != 422 || apiErr.Field != "Idempotency-Key" {
		t.Fatalf("reused key: %v", err)
	}

	// Wait returns once a worker finishes; Cancel of a finished job keeps it.
	sub2, err := c.Submit(ctx, job.Spec{Code: "print(2)"})
	if err != nil || !sub2.Accepted {
		t.Fatalf("Submit: %+v %v", sub2, err)
	}
	go func() { done <- e.work(ctx, "2\n", 0) }()
	v, err := c.Wait(ctx, sub2.ID)
	if err != nil || v.Status != job.StatusSucceeded || v.Stdout != "2\n" {
		t.Fatalf("Wait: %+v %v", v, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := c.Cancel(ctx, sub2.ID); err != nil || v.Status != job.StatusSucceeded {
		t.Fatalf("Cancel finished: %+v %v", v, err)
	}

	// Cancel a queued job.
	sub3, err := c.Submit(ctx, job.Spec{Code: "print(3)", Cache: job.CacheOff()})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Cancel(ctx, sub3.ID); err != nil || v.Status != job.StatusCanceled || v.Error == nil {
		t.Fatalf("Cancel queued: %+v %v", v, err)
	}

	// Batch: per-item outcomes in order.
	items, err := c.Batch(ctx, []job.Spec{{Code: "print(4)"}, {Code: ""}})
	if err != nil || len(items) != 2 {
		t.Fatalf("Batch: %v %v", items, err)
	}
	if items[0].Submission == nil || !items[0].Submission.Accepted || items[1].Err == nil || items[1].Err.Field != "jobs[1].code" {
		t.Fatalf("batch items: %+v %+v", items[0], items[1])
	}
	_, err = c.Batch(ctx, make([]job.Spec, 101))
	if !errors.As(err, &apiErr) || apiErr.Limit != 100 {
		t.Fatalf("batch of 101: %v", err)
	}

	list, err := c.List(ctx, []string{sub.ID, job.NewID()})
	if err != nil || len(list) != 2 || list[0] == nil || list[0].ID != sub.ID || list[1] != nil {
		t.Fatalf("List: %v %v", list, err)
	}

	_, err = c.Get(ctx, "../../etc/passwd", 0)
	if !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("bad id: %v", err)
	}
	_, err = c.Get(ctx, job.NewID(), 0)
	if !errors.As(err, &apiErr) || apiErr.Status != 404 || !strings.Contains(apiErr.Error(), "404") {
		t.Fatalf("unknown id: %v", err)
	}
}
