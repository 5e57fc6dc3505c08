package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// TestTenantConsumerSettingsHaveOneOwnerEach: the API owns the running-jobs
// bound, the workers own the delivery settings; neither undoes the other's.
func TestTenantConsumerSettingsHaveOneOwnerEach(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	api, workers := Config{}, Config{AckWait: 2 * time.Second, MaxDeliver: 5}
	if _, err := EnsureTenantConsumer(ctx, js, api, "python", "alice", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, job.TenantJobSubject("python", "alice"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if m, err := NewPicker(js, workers, "python").Next(ctx); err != nil || m == nil {
		t.Fatalf("pick: %v %v", m, err)
	}
	check := func(when string) {
		t.Helper()
		c, err := js.Consumer(ctx, job.StreamName, TenantConsumerName("python", job.TenantToken("alice")))
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.CachedInfo().Config
		if cfg.MaxAckPending != 3 || cfg.AckWait != 2*time.Second || cfg.MaxDeliver != 5 {
			t.Fatalf("%s: MaxAckPending %d AckWait %v MaxDeliver %d; want 3, 2s, 5", when, cfg.MaxAckPending, cfg.AckWait, cfg.MaxDeliver)
		}
	}
	check("after a worker bound it")
	if _, err := EnsureTenantConsumer(ctx, js, api, "python", "alice", 3); err != nil {
		t.Fatal(err)
	}
	check("after the API ensured it again")
}

// jobStream starts a NATS server of the test's own and makes the job
// stream on it.
func jobStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(testenv.StartNATS(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(context.Background(), js, Config{}); err != nil {
		t.Fatal(err)
	}
	return js
}
