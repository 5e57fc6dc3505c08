package callback_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/callback"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

var secret = []byte("acme-callback-secret")

// bundle is a deliverer's collaborators: real Redis and JetStream.
type bundle struct {
	store *cache.Store
	nc    *nats.Conn
	js    jetstream.JetStream
}

func setup(t *testing.T) *bundle {
	t.Helper()
	r, n := testenv.StartRedis(t), testenv.StartNATS(t)
	store, err := cache.New(context.Background(), cache.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.EnsureCallbackStream(context.Background(), js, queue.Config{}); err != nil {
		t.Fatal(err)
	}
	return &bundle{store: store, nc: nc, js: js}
}

// start runs a deliverer allowing loopback; stop ends it and waits.
func (b *bundle) start(t *testing.T, allow ...string) (stop func()) {
	t.Helper()
	nets, err := callback.ParseNetworks(allow)
	if err != nil {
		t.Fatal(err)
	}
	d, err := callback.New(callback.Config{NATS: b.nc, Store: b.store, Guard: callback.NewGuard(nets),
		Secrets:      func(tenant string) ([]byte, bool) { return secret, tenant == "acme" },
		RetryInitial: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("deliverer: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// endedJob records a job that ended with stdout "hi" and queues its callback,
// as a worker does.
func (b *bundle) endedJob(t *testing.T, url string) string {
	t.Helper()
	return b.endedJobOf(t, "acme", url)
}

// endedJobOf is endedJob for tenant's job.
func (b *bundle) endedJobOf(t *testing.T, tenant, url string) string {
	t.Helper()
	return b.endedJobOn(t, tenant, url, job.TenantCallbackSubject(tenant))
}

// endedJobOn is endedJobOf queueing the callback on subject ("" for the job
// id's, as workers queued callbacks before tenants had subjects).
func (b *bundle) endedJobOn(t *testing.T, tenant, url, subject string) string {
	t.Helper()
	ctx := context.Background()
	id := job.NewID()
	msg := job.Message{ID: id, Spec: job.Spec{Runtime: "python", Code: "print('hi')", CallbackURL: url}, CreatedAt: time.Now().UTC(), Tenant: tenant}
	if err := b.store.CreateJob(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.MarkRunningLeased(ctx, id, "w1", 1, time.Time{}, cache.Lease{Token: "w1/1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Finish(ctx, id, job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Stdout: "hi\n"}); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(job.CallbackRequest{ID: id, URL: url, Tenant: tenant, EndedAt: time.Now()})
	if subject == "" {
		subject = job.CallbackSubject(id)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(job.HeaderMsgID, "callback-"+id)
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *bundle) waitState(t *testing.T, id string, want job.CallbackDelivery) job.CallbackState {
	t.Helper()
	var rec cache.Record
	var err error
	if !testkit.Poll(15*time.Second, func() bool {
		rec, err = b.store.GetJob(context.Background(), id)
		return err == nil && rec.Callback != nil && rec.Callback.State == want
	}) {
		t.Fatalf("callback of %s: state %+v, err %v; want %s", id, rec.Callback, err, want)
	}
	return *rec.Callback
}

// waitAcked waits until the callback stream holds no message: every
// callback was acked (delivered or given up), so none will be tried again.
func (b *bundle) waitAcked(t *testing.T) {
	t.Helper()
	testenv.WaitDrained(t, b.js, job.CallbackStreamName, 15*time.Second)
}

// receiver answers with codes in turn (the last one from then on) and
// passes on every request it got, body read.
type receiver struct {
	mu    sync.Mutex
	codes []int
	got   chan *http.Request
	srv   *httptest.Server
}

func newReceiver(t *testing.T, codes ...int) *receiver {
	r := &receiver{codes: codes, got: make(chan *http.Request, 16)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(strings.NewReader(string(body)))
		r.mu.Lock()
		code := r.codes[0]
		if len(r.codes) > 1 {
			r.codes = r.codes[1:]
		}
		r.mu.Unlock()
		r.got <- req
		w.WriteHeader(code)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func TestDeliversSignedResult(t *testing.T) {
	b := setup(t)
	b.start(t, "127.0.0.0/8")
	rcv := newReceiver(t, 200)
	id := b.endedJob(t, rcv.srv.URL+"/hook?x=1")
	req := <-rcv.got
	body, _ := io.ReadAll(req.Body)
	if err := callback.Verify(secret, req.Header.Get("Kiln-Signature"), body, time.Now(), time.Minute); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if req.Header.Get("Kiln-Job-Id") != id || req.URL.RawQuery != "x=1" || req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v, query %q", req.Header, req.URL.RawQuery)
	}
	var res job.Result
	if err := json.Unmarshal(body, &res); err != nil || res.ID != id || res.Status != job.StatusSucceeded || res.Stdout != "hi\n" {
		t.Fatalf("body %s: %v", body, err)
	}
	st := b.waitState(t, id, job.CallbackDelivered)
	if st.Attempts != 1 || st.LastStatus != 200 || st.DeliveredAt == nil {
		t.Errorf("state %+v", st)
	}
}

func TestRetries5xxThenDelivers(t *testing.T) {
	b := setup(t)
	b.start(t, "127.0.0.0/8")
	rcv := newReceiver(t, 500, 500, 500, 200)
	id := b.endedJob(t, rcv.srv.URL)
	st := b.waitState(t, id, job.CallbackDelivered)
	if st.Attempts != 4 || st.LastStatus != 200 {
		t.Errorf("delivered after %d attempts (status %d); want the 4th", st.Attempts, st.LastStatus)
	}
	for i := 1; i <= 4; i++ {
		if got := (<-rcv.got).Header.Get("Kiln-Delivery-Attempt"); got != string(rune('0'+i)) {
			t.Errorf("request %d says attempt %s", i, got)
		}
	}
}

func TestA4xxIsPermanent(t *testing.T) {
	b := setup(t)
	b.start(t, "127.0.0.0/8")
	rcv := newReceiver(t, 404, 200)
	id := b.endedJob(t, rcv.srv.URL)
	st := b.waitState(t, id, job.CallbackFailed)
	if st.Attempts != 1 || st.LastStatus != 404 || !strings.Contains(st.LastError, "404") {
		t.Errorf("state %+v", st)
	}
	select {
	case <-rcv.got:
	default:
		t.Fatal("no request")
	}
	// The callback is acked, so nothing is left to try again.
	b.waitAcked(t)
	if len(rcv.got) != 0 {
		t.Error("a 404 was retried")
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	b := setup(t)
	b.start(t, "127.0.0.0/8")
	target := newReceiver(t, 200)
	redir := httptest.NewServer(http.RedirectHandler(target.srv.URL, http.StatusTemporaryRedirect))
	t.Cleanup(redir.Close)
	id := b.endedJob(t, redir.URL)
	st := b.waitState(t, id, job.CallbackFailed)
	if st.LastStatus != http.StatusTemporaryRedirect || !strings.Contains(st.LastError, "redirects are not followed") {
		t.Errorf("state %+v", st)
	}
	if len(target.got) != 0 {
		t.Error("the redirect was followed")
	}
}

func TestLoopbackRefusedAtDeliveryUnlessAllowed(t *testing.T) {
	b := setup(t)
	b.start(t) // public addresses only
	rcv := newReceiver(t, 200)
	id := b.endedJob(t, rcv.srv.URL)
	st := b.waitState(t, id, job.CallbackFailed)
	if !strings.Contains(st.LastError, "loopback") || len(rcv.got) != 0 {
		t.Errorf("state %+v, %d requests", st, len(rcv.got))
	}
}

func TestSurvivesDelivererRestartWhileReceiverDown(t *testing.T) {
	b := setup(t)
	stop := b.start(t, "127.0.0.0/8")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connections are refused
	id := b.endedJob(t, "http://"+addr+"/hook")
	var rec cache.Record
	testkit.Eventually(t, 10*time.Second, "two failed attempts recorded", func() bool {
		rec, _ = b.store.GetJob(context.Background(), id)
		return rec.Callback != nil && rec.Callback.Attempts >= 2
	})
	if rec.Callback.State != job.CallbackPending || !strings.Contains(rec.Callback.LastError, "refused") {
		t.Fatalf("state %+v", rec.Callback)
	}
	stop()
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	rcv := &receiver{codes: []int{200}, got: make(chan *http.Request, 4)}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rcv.got <- r
	})}}
	srv.Start()
	t.Cleanup(srv.Close)
	b.start(t, "127.0.0.0/8")
	st := b.waitState(t, id, job.CallbackDelivered)
	if st.Attempts < 3 {
		t.Errorf("state %+v", st)
	}
}
