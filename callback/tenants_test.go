package callback_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/callback"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// Issue 23, acceptance 4: with one tenant's callbacks pointed at a
// receiver that never answers, another tenant's callback arrives within
// seconds: the hog holds at most its tenant's share of the deliverer
// (TenantConcurrency), its other callbacks wait without counting attempts,
// on its own consumer. 1,100 of them (the acceptance asks for 100): more
// than a consumer's MaxAckPending (1024), which a shared consumer would let
// the hog's waiting callbacks fill.
func TestHangingReceiverDelaysOnlyItsTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nets, err := callback.ParseNetworks([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := callback.New(callback.Config{NATS: b.nc, Store: b.store, Guard: callback.NewGuard(nets),
		Secrets:           func(string) ([]byte, bool) { return secret, true },
		TenantConcurrency: func(tenant string) int { return map[string]int{"hog": 3}[tenant] },
		Timeout:           5 * time.Second, RetryInitial: time.Second, RetryMax: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	var inFlight, most atomic.Int64
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	var hogIDs []string
	for range 1100 {
		hogIDs = append(hogIDs, b.endedJobOf(t, "hog", hang.URL+"/hook"))
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)

	// The hog's receiver holds its slots first.
	testkit.Eventually(t, 20*time.Second, "three of the hog's callbacks in flight at its receiver", func() bool { return inFlight.Load() >= 3 })
	// ... and its waiting callbacks fill its consumer's MaxAckPending.
	hogCons, err := b.js.Consumer(context.Background(), job.CallbackStreamName, queue.TenantCallbackConsumerConfig(job.TenantToken("hog")).Durable)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	if !testkit.Poll(20*time.Second, func() bool {
		info, err = hogCons.Info(context.Background())
		return err == nil && info.NumAckPending >= 1024
	}) {
		t.Fatalf("the hog's consumer: %+v %v; want 1024 callbacks pending", info, err)
	}
	good := newReceiver(t, 200)
	start := time.Now()
	id := b.endedJobOf(t, "acme", good.srv.URL+"/hook")
	select {
	case req := <-good.got:
		took := time.Since(start)
		t.Logf("another tenant's callback arrived %v after its job ended, with %d of the hog's callbacks hanging", took.Round(time.Millisecond), inFlight.Load())
		if req.Header.Get(job.HeaderJobID) != id {
			t.Fatalf("got the callback of %s", req.Header.Get(job.HeaderJobID))
		}
		if took > 5*time.Second {
			t.Errorf("another tenant's callback took %v", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("another tenant's callback did not arrive within 20 s")
	}
	if m := most.Load(); m > 3 {
		t.Errorf("the hog had %d callbacks in flight at once; its share is 3", m)
	}
	stop()
	// Deferred deliveries are not attempts: no hog callback counts more
	// attempts than it was sent.
	for _, hid := range hogIDs[:10] {
		rec, err := b.store.GetJob(context.Background(), hid)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Callback != nil && rec.Callback.Attempts > 1 {
			t.Errorf("hog callback %s: %d attempts recorded within one 5 s attempt's time", hid, rec.Callback.Attempts)
		}
	}
}

// A callback queued on the subject used before tenants had their own (the
// job id's) is still delivered, next to one on its tenant's subject.
func TestLegacySubjectCallbackIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, "127.0.0.0/8")
	rcv := newReceiver(t, 200)
	ids := map[string]bool{b.endedJobOn(t, "acme", rcv.srv.URL+"/hook", ""): true, b.endedJobOf(t, "acme", rcv.srv.URL+"/hook"): true}
	for range 2 {
		select {
		case req := <-rcv.got:
			delete(ids, req.Header.Get(job.HeaderJobID))
		case <-time.After(10 * time.Second):
			t.Fatalf("callbacks of %v not delivered", ids)
		}
	}
	if len(ids) != 0 {
		t.Fatalf("callbacks of %v not delivered", ids)
	}
}
