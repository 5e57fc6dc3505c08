package queue

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// Jobs queued by the previous version (each tenant's subject read through a
// durable consumer of its own, one of them still running a job) are run by
// this version's pickers, and the old consumers are deleted once none holds
// a running job.
func TestPreviousLayoutIsDrained(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	// The previous version's consumers: a tenant's, with the bound it held,
	// and the runtime-wide one of messages without a tenant.
	legacy := []jetstream.ConsumerConfig{
		{Durable: "kiln-worker-python-" + job.TenantToken("alice"), FilterSubject: job.TenantJobSubject("python", "alice"), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 2},
		{Durable: "kiln-worker-python", FilterSubject: job.JobSubject("python"), AckPolicy: jetstream.AckExplicitPolicy},
	}
	var aliceOld jetstream.Consumer
	for _, cc := range legacy {
		c, err := js.CreateConsumer(ctx, job.StreamName, cc)
		if err != nil {
			t.Fatal(err)
		}
		if aliceOld == nil {
			aliceOld = c
		}
	}
	// Three of alice's jobs and one without a tenant, published as the
	// previous version did (no bound in the header); an old worker is still
	// running alice's first.
	for range 3 {
		publishJob(t, js, "alice", 0)
	}
	old := nats.NewMsg(job.JobSubject("python"))
	old.Data = []byte(`{"id":"` + job.NewID() + `"}`)
	if _, err := js.PublishMsg(ctx, old); err != nil {
		t.Fatal(err)
	}
	batch, err := aliceOld.FetchNoWait(1)
	if err != nil {
		t.Fatal(err)
	}
	var running jetstream.Msg
	for m := range batch.Messages() {
		running = m
	}
	if running == nil {
		t.Fatal("the old worker got no job")
	}
	if left, err := RetireLegacyConsumers(ctx, js); err != nil || left != 1 {
		t.Fatalf("RetireLegacyConsumers: %d left, %v; want alice's, still running a job", left, err)
	}
	p := NewPicker(js, Config{}, "python")
	seen := map[string]int{}
	for {
		m, err := p.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			break
		}
		seen[tenantOfMsg(t, m)]++
		_ = m.DoubleAck(ctx)
	}
	// The job the old worker holds is still in the backlog subject too: this
	// version moves it like the others (the job's record, claimed under the
	// old worker's lease, keeps it from running twice: worker tests).
	if seen[job.TenantJobSubject("python", "alice")] != 3 || seen[job.TenantJobSubject("python", job.DefaultTenant)] != 1 {
		t.Fatalf("picked %v; want alice's 3 and the tenant-less one (as the default tenant's)", seen)
	}
	_ = running.Ack()
	if left, err := RetireLegacyConsumers(ctx, js); err != nil || left != 0 {
		t.Fatalf("RetireLegacyConsumers after the old worker's job ended: %d left, %v", left, err)
	}
	if n := consumerCount(t, js, job.StreamName); n != 0 {
		t.Fatalf("%d consumers left on the job stream", n)
	}
}

// Queued and Backlog count what waits in the backlogs, not what was taken.
func TestQueuedCountsTheBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	for range 3 {
		publishJob(t, js, "alice", 0)
	}
	publishJob(t, js, "bob", 0)
	if _, err := NewPicker(js, Config{}, "python").Next(ctx); err != nil {
		t.Fatal(err)
	}
	jobs, err := js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Queued(ctx, jobs, job.TenantJobSubject("python", "alice"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Queued(ctx, jobs, job.TenantJobSubject("python", "bob"))
	if err != nil {
		t.Fatal(err)
	}
	if a+b != 3 {
		t.Fatalf("queued alice %d bob %d; want 3 in all after one was taken", a, b)
	}
	all, err := Backlog(ctx, jobs)
	if err != nil || all["python"] != 3 {
		t.Fatalf("backlog %v %v; want python 3", all, err)
	}
}

func TestConsumerNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name            string
		runtime, legacy bool
	}{
		{RunConsumerName("python", 0), true, false},
		{RunConsumerName("python", 12), true, false},
		{RunConsumerName("python-slim", 0), false, false},
		{"kiln-worker-python", false, true},
		{"kiln-worker-python-slim", false, true},
		{"kiln-worker-python-" + job.TenantToken("alice"), false, true},
		{"someone-elses", false, false},
	} {
		if got := IsRuntimeConsumer(c.name, "python"); got != c.runtime {
			t.Errorf("IsRuntimeConsumer(%q, python) = %v", c.name, got)
		}
		if got := IsLegacyConsumer(c.name); got != c.legacy {
			t.Errorf("IsLegacyConsumer(%q) = %v", c.name, got)
		}
	}
}

// jobStream starts a NATS server of the test's own and makes the job
// stream and the ready stream on it.
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
	if _, err := EnsureReadyStream(context.Background(), js, Config{}); err != nil {
		t.Fatal(err)
	}
	return js
}

// A message another worker deleted first is gone, not an error: the
// server's answer to the second deletion, as the client reports it, is
// recognised (two workers promoting one tenant's oldest job race so).
func TestDeletingAMessageTwiceIsGone(t *testing.T) {
	js := jobStream(t)
	ctx := context.Background()
	ack, err := js.Publish(ctx, job.SubjectPrefix+"python.t1", []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	err = s.DeleteMsg(ctx, ack.Sequence)
	if err == nil || !isMsgGone(err) {
		t.Fatalf("deleting a deleted message: %v; want it recognised as gone", err)
	}
	if isMsgGone(jetstream.ErrMsgDeleteUnsuccessful) {
		t.Error("a deletion refused for another reason is taken for a message gone")
	}
}
