package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/callback"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/redact"
	"github.com/kilnrun/kiln/sandbox"
	"github.com/kilnrun/kiln/worker"
)

// redactionKeys are the keys the job prints, as Python expressions that
// build them from parts: the job's code, which the API keeps, never holds
// a whole key, so any whole key found in an answer came from the output.
var redactionKeys = []struct{ kind, expr string }{
	{redact.KindAWSAccessKey, `"AKIA" + "QWERTYUIOPASDFGH"`},
	{redact.KindGitHubToken, `"ghp_" + "x7Yk" * 9`},
	{redact.KindGitLabToken, `"glpat-" + "Zq3_kLm9-Pw8rTy2Vb6n"`},
	{redact.KindSlackToken, `"xoxb-" + "123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"`},
	{redact.KindStripeKey, `"sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"`},
	{redact.KindOpenAIKey, `"sk-proj-" + "Ab3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9fG1hJ3"`},
	{redact.KindAnthropicKey, `"sk-ant-api03-" + "Zx9_Lm2-Qw" * 9`},
	{redact.KindGoogleAPIKey, `"AIza" + "SyD3v8k2LmN0pQr5StUvWxYz1234567890_"`},
	{redact.KindJWT, `"eyJ" + "hbGciOiJIUzI1NiJ9." + "eyJ" + "zdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ." + "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"`},
	{redact.KindPrivateKey, `"-----BEGIN " + "EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oJeKrHLxgaDAoAoGCCqGSM49\nAwEHoUQDQgAEPLy3kZ3bZxP0kq9YJ4lR0dI2fQn8L7vS0D6m5n1uW4o=\n-----END " + "EC PRIVATE KEY-----"`},
}

// Acceptance 1 of issue 26: a job printing ten keys of different kinds
// (one split across two writes with a pause between, one in stderr, one in
// an artifact's name, plus the tenant's registered secret) shows none of
// them in GET, the SSE stream, the cached hit, the callback body or the
// worker's log; "redactions" counts them by kind.
func TestRedactionAcrossThePipeline(t *testing.T) {
	e := setup(t)
	const apiKey, tenant = "redact-key", "redactor"
	secret := "tenant-vault-passphrase-42"
	fp, err := redact.Fingerprint(secret)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := callback.ParseNetworks([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	cbSecret := []byte("redactor-callback-secret")
	policy := callback.Policy{Guard: callback.NewGuard(nets), Secrets: func(string) ([]byte, bool) { return cbSecret, true }}
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, APIKeys: map[string]string{apiKey: tenant},
		Tenants:   map[string]producer.Tenant{tenant: {Redact: &job.RedactPolicy{Secrets: []job.SecretPrint{fp}}}},
		Callbacks: policy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	d, err := callback.New(callback.Config{NATS: e.nc, Store: e.store, Queue: testQueue, Guard: policy.Guard,
		Secrets: policy.Secrets, RetryInitial: 100 * time.Millisecond, RetryMax: 400 * time.Millisecond, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stopD := context.WithCancel(context.Background())
	dDone := make(chan error, 1)
	go func() { dDone <- d.Run(dctx) }()
	t.Cleanup(func() { stopD(); <-dDone })
	bodies := make(chan []byte, 4)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- b
	}))
	t.Cleanup(receiver.Close)
	var logs testkit.SyncBuffer
	startLoggedWorker(t, e, "w-redact", slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))

	var code strings.Builder
	code.WriteString("import os, sys, time\nK = [\n")
	for _, k := range redactionKeys {
		fmt.Fprintf(&code, "    %s,\n", k.expr)
	}
	code.WriteString(`]
time.sleep(1)
print("\n".join("line %d: some ordinary output to fill the stream" % i for i in range(40)), flush=True)
for k in K:
    print("key:", k, flush=True)
gh = K[1]
sys.stdout.write("split: " + gh[:14]); sys.stdout.flush()
time.sleep(0.6)
sys.stdout.write(gh[14:] + "\n"); sys.stdout.flush()
print("vault " + "tenant-vault-" + "passphrase-42", flush=True)
print("Traceback: request failed with Authorization: Bearer " + K[5], file=sys.stderr, flush=True)
open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "dump-" + K[0] + ".txt"), "w").write("x")
`)
	submit := func(cb bool) map[string]any {
		spec := map[string]any{"code": code.String(), "runtime": "python"}
		if cb {
			spec["callback_url"] = receiver.URL + "/hook"
		}
		b, _ := json.Marshal(spec)
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/jobs", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode >= 300 {
			t.Fatalf("submit: %d %v %v", resp.StatusCode, body, err)
		}
		return body
	}
	get := func(path string) string {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	first := submit(true)
	id, _ := first["id"].(string)
	// Followed live from the start (the job sleeps first): its output
	// events, and the result it ends with.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	evs := collect(t, followEventsAs(t, ctx, hs.URL, id, apiKey), 90*time.Second)
	rec := e.waitRecord(t, id, 90*time.Second, func(r cache.Record) bool { return r.Status.Terminal() })
	if rec.Status != job.StatusSucceeded {
		t.Fatalf("job %s: %s %+v\nstderr %s", id, rec.Status, rec.Result.Error, rec.Result.Stderr)
	}
	answers := map[string]string{"GET": get("/v1/jobs/" + id)}

	var live strings.Builder
	outputs := 0
	var sse strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&sse, "%s %s\n", ev.typ, ev.data)
		if ev.typ == job.EventStdout {
			outputs++
			live.WriteString(outputText(t, ev))
		}
	}
	answers["SSE"] = sse.String()
	answers["SSE output"] = live.String()
	if outputs < 2 || !strings.Contains(live.String(), "split: "+redact.Replacement(redact.KindGitHubToken)+"\n") {
		t.Errorf("live stdout over %d events lacks the split key's replacement:\n%s", outputs, live.String())
	}

	select {
	case b := <-bodies:
		answers["callback"] = string(b)
	case <-time.After(60 * time.Second):
		t.Fatal("no callback within 60s")
	}

	hit := submit(false)
	if hit["cache_hit"] != true {
		t.Fatalf("second submission was not a cache hit: %v", hit["cache_hit"])
	}
	hitJSON, _ := json.Marshal(hit)
	answers["cache hit"] = string(hitJSON)
	answers["worker log"] = logs.String()

	// The keys as the job built them, to look for in every answer.
	keys := []string{secret, "AKIAQWERTYUIOPASDFGH", "ghp_" + strings.Repeat("x7Yk", 9), "glpat-Zq3_kLm9-Pw8rTy2Vb6n",
		"xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
		"sk-proj-Ab3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9fG1hJ3", "sk-ant-api03-" + strings.Repeat("Zx9_Lm2-Qw", 9),
		"AIzaSyD3v8k2LmN0pQr5StUvWxYz1234567890_", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
		"MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oJeKrHLxgaDAoAoGCCqGSM49"}
	for where, text := range answers {
		if len(text) == 0 {
			t.Errorf("%s: empty", where)
		}
		for _, k := range keys {
			if strings.Contains(text, k) || strings.Contains(text, strings.ReplaceAll(k, "\n", `\n`)) {
				t.Errorf("%s holds %.24s...", where, k)
			}
		}
	}
	want := map[string]int{redact.KindSecret: 1, redact.KindAuthorization: 1}
	for _, k := range redactionKeys {
		want[k.kind]++
	}
	want[redact.KindAWSAccessKey]++ // the artifact's name
	want[redact.KindGitHubToken]++  // the split copy
	if fmt.Sprint(rec.Result.Redactions) != fmt.Sprint(want) {
		t.Errorf("redactions %v\nwant       %v", rec.Result.Redactions, want)
	}
	if len(rec.Result.Artifacts) != 1 || rec.Result.Artifacts[0].Name != "dump-"+redact.Replacement(redact.KindAWSAccessKey)+".txt" {
		t.Errorf("artifacts %+v", rec.Result.Artifacts)
	}
	if !strings.Contains(answers["GET"], `"redactions":{`) {
		t.Errorf("GET lacks redactions: %.300s", answers["GET"])
	}
}

// startLoggedWorker is startWorker with the worker's and its sandbox's log
// going to log.
func startLoggedWorker(t *testing.T, e *env, id string, log *slog.Logger) {
	t.Helper()
	sb, err := sandbox.New(context.Background(), sandbox.Config{Address: e.containerd, Namespace: testenv.ContainerdNamespace(),
		WorkerID: id, LeaseScope: e.store.Identity(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{ID: id, Runtime: sb, Store: e.store, NATS: e.nc, Concurrency: 1,
		Queue: testQueue, Heartbeat: 300 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker %s: %v", id, err)
		}
		sb.Close()
	})
	e.waitRuntime(t)
}

// followEventsAs is followEvents with an API key.
func followEventsAs(t *testing.T, ctx context.Context, base, id, apiKey string) <-chan sseEvent {
	t.Helper()
	// The events route reads the key from the Authorization header, which
	// followEvents does not set: go through a loopback proxy that adds it.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.Path, nil)
		req.Header = r.Header.Clone()
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(proxy.Close)
	return followEvents(t, ctx, proxy.URL, id, "")
}
