package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// TestOutputIsRedactedBeforeItLeavesTheWorker: keys a job prints, in
// stdout (one split across two live chunks), stderr, its error message and
// an artifact's name, reach neither the stored result, the result cache,
// the live events nor the worker's log; the result counts them by kind, and
// a tenant's registered secret and pattern count too.
func TestOutputIsRedactedBeforeItLeavesTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var logs testkit.SyncBuffer
	aws := "AKIA" + "QWERTYUIOPASDFGH"
	gh := "ghp_" + strings.Repeat("x7Yk", 9)
	stripe := "sk_live_" + strings.Repeat("4eC39HqLyjWDarjtT1zdp7dc", 1)
	anth := "sk-ant-api03-" + strings.Repeat("Zx9_Lm2-Qw", 9)
	secret := "tenant-vault-passphrase-42"
	fp, err := redact.Fingerprint(secret)
	if err != nil {
		t.Fatal(err)
	}
	stdout := "boot\n" + strings.Repeat("working ...\n", 80) + "AWS=" + aws + "\nGH " + gh + "\nvault: " + secret + "\ncase EMP-778899\n"
	split := strings.Index(stdout, gh) + 12 // the live stream is cut inside the GitHub token
	firstChunk := make(chan struct{})
	rt := &requestRuntime{Runtime: &testkit.Runtime{}, run: func(ctx context.Context, h sandboxapi.Request) (job.Result, error) {
		h.Output("stdout", []byte(stdout[:split]))
		select { // the first part is published before the rest is written
		case <-firstChunk:
		case <-ctx.Done():
			return job.Result{}, ctx.Err()
		}
		h.Output("stdout", []byte(stdout[split:]))
		h.Output("stderr", []byte("Traceback: bad key "+stripe+"\n"))
		r := job.Result{Status: job.StatusFailed, ExitCode: job.IntPtr(1),
			Error:     job.NewFailure(job.CategoryRuntimeError, "ValueError: key "+anth+" refused"),
			Artifacts: []job.Artifact{{Name: "dump-" + aws + ".txt", Size: 1, SHA256: strings.Repeat("a", 64)}},
			Image:     job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}}
		r.SetOutput([]byte(stdout), []byte("Traceback: bad key "+stripe+"\n"))
		return r, nil
	}}
	m := b.record(t, "print(keys)")
	m.Redact = &job.RedactPolicy{Secrets: []job.SecretPrint{fp}, Patterns: []job.RedactPattern{{Name: "employee", Regexp: `EMP-[0-9]{6}`}}}
	if err := b.store.DeleteJob(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CreateJob(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var live testkit.SyncBuffer
	var once sync.Once
	sub, err := b.nc.Subscribe(job.EventsSubject(m.ID), func(msg *nats.Msg) {
		typ := msg.Header.Get(job.HeaderEvent)
		if typ != job.EventStdout && typ != job.EventStderr {
			return
		}
		var ev job.OutputEvent
		if err := json.Unmarshal(msg.Data, &ev); err == nil {
			p, _ := ev.Bytes()
			_, _ = live.Write(p)
		}
		once.Do(func() { close(firstChunk) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b.start(t, rt, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	b.publish(t, m)
	rec := b.waitTerminal(t, m.ID, 20*time.Second)

	keys := []string{aws, gh, stripe, anth, secret, "EMP-778899"}
	r := rec.Result
	cached, ok, err := b.store.LookupResult(context.Background(), m.Key)
	if err != nil || !ok {
		t.Fatalf("cached result: %v %v", ok, err)
	}
	cachedJSON, _ := json.Marshal(cached)
	storedJSON, _ := json.Marshal(r)
	testkit.Eventually(t, 10*time.Second, "the live output", func() bool {
		return strings.Contains(live.String(), "EMP") || strings.Contains(live.String(), "employee]")
	})
	for name, text := range map[string]string{"stored": string(storedJSON), "cached": string(cachedJSON), "live": live.String(), "log": logs.String()} {
		for _, k := range keys {
			if strings.Contains(text, k) {
				t.Errorf("%s output holds %q", name, k)
			}
		}
	}
	want := map[string]int{redact.KindAWSAccessKey: 2, redact.KindGitHubToken: 1, redact.KindStripeKey: 1,
		redact.KindAnthropicKey: 1, redact.KindSecret: 1, "pattern:employee": 1}
	if !mapsEqual(r.Redactions, want) {
		t.Errorf("redactions %v, want %v", r.Redactions, want)
	}
	if !strings.Contains(live.String(), "GH "+redact.Replacement(redact.KindGitHubToken)+"\n") {
		t.Errorf("live output lacks the split token's replacement:\n%s", live.String())
	}
	if r.Artifacts[0].Name != "dump-"+redact.Replacement(redact.KindAWSAccessKey)+".txt" {
		t.Errorf("artifact name %q", r.Artifacts[0].Name)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A tenant with redaction off gets its output as written.
func TestRedactionOffKeepsOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	key := "AKIA" + "ZXCVBNMLKJHGFDSA"
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		r := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Image: job.Image{Name: "kiln.local/python:latest", Digest: "sha256:test"}}
		r.SetOutput([]byte(key+"\n"), nil)
		return r, nil
	}}
	m := b.record(t, "print(key)")
	m.Redact = &job.RedactPolicy{Mode: job.RedactOff}
	if err := b.store.DeleteJob(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CreateJob(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	b.start(t, rt, nil)
	b.publish(t, m)
	r := b.waitTerminal(t, m.ID, 20*time.Second).Result
	if r.Stdout != key+"\n" || r.Redactions != nil {
		t.Fatalf("stdout %q, redactions %v", r.Stdout, r.Redactions)
	}
}
