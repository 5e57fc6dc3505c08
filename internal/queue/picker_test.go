package queue

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// publishJob queues a job of tenant for python as the API does: on the
// tenant's backlog subject, the job id as its message id and header, and the
// tenant's running-jobs bound (0: none) in its header.
func publishJob(t *testing.T, js jetstream.JetStream, tenant string, bound int) string {
	t.Helper()
	id := job.NewID()
	m := nats.NewMsg(job.TenantJobSubject("python", tenant))
	m.Data = []byte(`{"id":"` + id + `"}`)
	m.Header.Set(job.HeaderMsgID, id)
	m.Header.Set(job.HeaderJobID, id)
	if bound > 0 {
		m.Header.Set(job.HeaderMaxRunning, strconv.Itoa(bound))
	}
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return id
}

// tenantOfMsg is the backlog subject a picked job came from.
func tenantOfMsg(t *testing.T, m jetstream.Msg) string {
	t.Helper()
	subj, ok := BacklogSubjectOf(m.Subject())
	if !ok {
		t.Fatalf("picked a message on %s, not a ready subject", m.Subject())
	}
	return subj
}

// A worker's cached listing of the subjects holding jobs stays true
// without asking the stream: a hinted subject is in it at once, a subject
// with nothing to move leaves it (empty, or its tenant at its bound); the
// stream is asked again when invalidated or when the listing is maxAge old
// (on the lister's clock), and not otherwise.
func TestCachedListerKeepsItsListingTrue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	subj := func(tenant string) string { return job.TenantJobSubject("python", tenant) }
	publish := func(tenant string) { publishJob(t, js, tenant, 1) }
	clock := testkit.NewClock(time.Unix(1_800_000_000, 0))
	l := NewCachedLister(js, time.Minute, clock.Now)
	p := l.NewPicker(Config{}, "python")
	listing := func(want ...string) {
		t.Helper()
		got, err := l.Waiting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var w []string
		for _, tenant := range want {
			w = append(w, subj(tenant))
		}
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Fatalf("listing %v, want %v", got, w)
		}
	}

	publish("alice")
	listing("alice")
	publish("bob")
	listing("alice") // kept: the stream is not asked again
	l.Hint(subj("bob"))
	listing("alice", "bob")

	// alice's one job taken and acked: her next turn finds nothing, and her
	// subject leaves the listing.
	m, err := p.NextAmong(ctx, mustWaiting(t, l))
	if err != nil || m == nil || tenantOfMsg(t, m) != subj("alice") {
		t.Fatalf("first pick: %v %v", m, err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = p.NextAmong(ctx, mustWaiting(t, l))
	if err != nil || m == nil || tenantOfMsg(t, m) != subj("bob") {
		t.Fatalf("second pick: %v %v", m, err)
	}
	if m, err := p.NextAmong(ctx, []string{subj("alice")}); err != nil || m != nil {
		t.Fatalf("alice's empty subject: %v %v", m, err)
	}
	listing("bob")

	// bob at his bound (one running, unacked) with a second job queued: his
	// turn moves nothing and his subject is dropped, until his running job
	// settles and the worker hints it again.
	publish("bob")
	if m, err := p.NextAmong(ctx, []string{subj("bob")}); err != nil || m != nil {
		t.Fatalf("bob at his bound: %v %v", m, err)
	}
	listing()
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	l.Hint(tenantOfMsg(t, m))
	listing("bob")

	// carol's job without a hint is seen once the listing is invalidated,
	// or once it is maxAge old.
	publish("carol")
	listing("bob")
	l.Invalidate()
	listing("bob", "carol")
	publish("alice")
	clock.Advance(time.Minute - time.Second)
	listing("bob", "carol")
	clock.Advance(time.Second)
	listing("alice", "bob", "carol")
}

// Tenants take turns: a tenant with many jobs queued gets one job a turn,
// like a tenant with one, and a newcomer's job is next after the job
// running now, however many the heavy tenant holds.
func TestPickerTakesTenantsInTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	for range 50 {
		publishJob(t, js, "heavy", 0)
	}
	p := NewPicker(js, Config{}, "python")
	first := pick(t, p)
	if first != job.TenantJobSubject("python", "heavy") {
		t.Fatalf("first pick from %s", first)
	}
	publishJob(t, js, "light", 0)
	publishJob(t, js, "other", 0)
	var got []string
	for range 4 {
		got = append(got, pick(t, p))
	}
	want := map[string]int{job.TenantJobSubject("python", "light"): 1, job.TenantJobSubject("python", "other"): 1, job.TenantJobSubject("python", "heavy"): 2}
	count := map[string]int{}
	for _, s := range got[:3] {
		count[s]++
	}
	if count[job.TenantJobSubject("python", "light")] != 1 || count[job.TenantJobSubject("python", "other")] != 1 {
		t.Fatalf("the newcomers were not served within the next round: %v (want each of %v once in the first three)", got, want)
	}
	if n := readyCount(t, js); n != 0 {
		t.Fatalf("%d jobs left in the ready stream after each pick took its own", n)
	}
	_ = ctx
}

// pick takes the next job, acks it, and returns its tenant's subject.
func pick(t *testing.T, p *Picker) string {
	t.Helper()
	m, err := p.Next(context.Background())
	if err != nil || m == nil {
		t.Fatalf("pick: %v %v", m, err)
	}
	if err := m.DoubleAck(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tenantOfMsg(t, m)
}

func readyCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), job.ReadyStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A tenant's running-jobs bound holds across workers (three pickers on one
// stream): no more of its jobs are out at once than the bound, each ended
// job lets the next one go, and another tenant is not held back meanwhile.
func TestRunningBoundHoldsAcrossWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	for range 6 {
		publishJob(t, js, "bounded", 2)
	}
	workers := []*Picker{NewPicker(js, Config{}, "python"), NewPicker(js, Config{}, "python"), NewPicker(js, Config{}, "python")}
	var out []jetstream.Msg
	for _, p := range workers {
		if m, err := p.Next(ctx); err != nil {
			t.Fatal(err)
		} else if m != nil {
			out = append(out, m)
		}
	}
	if len(out) != 2 {
		t.Fatalf("%d of the tenant's jobs out at once, bound 2", len(out))
	}
	publishJob(t, js, "free", 0)
	m, err := workers[2].Next(ctx)
	if err != nil || m == nil || tenantOfMsg(t, m) != job.TenantJobSubject("python", "free") {
		t.Fatalf("another tenant's job while the bounded one is at its bound: %v %v", m, err)
	}
	_ = m.DoubleAck(ctx)
	for i := range 4 {
		if err := out[0].DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		out = out[1:]
		m, err := workers[i%3].Next(ctx)
		if err != nil || m == nil {
			t.Fatalf("after a job ended, the next of the bounded tenant: %v %v", m, err)
		}
		out = append(out, m)
		if extra, err := workers[(i+1)%3].Next(ctx); err != nil || extra != nil {
			t.Fatalf("a third job out at once: %v %v", extra, err)
		}
	}
}

// A job whose worker was lost before it acked is delivered again from the
// ready stream, keeping its tenant's lane (the bound still holds while it
// waits for its redelivery), though nothing is left in the tenant's backlog.
func TestLostWorkersJobIsTakenAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	cfg := Config{AckWait: 200 * time.Millisecond}
	if _, err := EnsureReadyOwned(ctx, js, cfg, "python", true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	id := publishJob(t, js, "alice", 1)
	publishJob(t, js, "alice", 1)
	lost := NewPicker(js, cfg, "python")
	if m, err := lost.Next(ctx); err != nil || m == nil {
		t.Fatalf("first delivery: %v %v", m, err)
	}
	other := NewPicker(js, cfg, "python")
	var m jetstream.Msg
	if !testkit.Poll(10*time.Second, func() bool {
		var err error
		m, err = other.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m != nil
	}) {
		t.Fatal("the lost worker's job was never delivered again")
	}
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Headers().Get(job.HeaderJobID); got != id || meta.NumDelivered != 2 {
		t.Fatalf("got job %s delivery %d; want the lost job %s, delivery 2", got, meta.NumDelivered, id)
	}
}

// Moving a job to the ready stream twice (a worker lost between the copy and
// the deletion of the original, or two workers that read the same oldest
// job) stores it once, and the second move says it raced.
func TestJobMovedTwiceIsReadyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	publishJob(t, js, "alice", 0)
	jobs, err := js.Stream(ctx, job.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	subj := job.TenantJobSubject("python", "alice")
	raw, err := jobs.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subj))
	if err != nil {
		t.Fatal(err)
	}
	// The second move is the stream's duplicate: nothing to wait for.
	for _, want := range []promotion{promoted, raced} {
		// The original is put back as if the deletion had not happened.
		if what, err := promote(ctx, jobs, js, "python", subj, 0); err != nil || what != want {
			t.Fatalf("promote: %v %v; want %v", what, err, want)
		}
		m := nats.NewMsg(subj)
		m.Data, m.Header = raw.Data, nats.Header{job.HeaderJobID: raw.Header[job.HeaderJobID]}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if n := readyCount(t, js); n != 1 {
		t.Fatalf("%d copies of the job in the ready stream, want 1", n)
	}
}

// With several shards, each tenant's jobs go to its own shard's consumer
// and every job is taken; the stream's consumers are the runtime's shards,
// however many tenants there are.
func TestShardsServeEveryTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := jobStream(t)
	cfg := Config{Shards: 3}
	want := map[string]bool{}
	for i := range 30 {
		tenant := fmt.Sprintf("t%d", i)
		publishJob(t, js, tenant, 0)
		want[job.TenantJobSubject("python", tenant)] = true
	}
	p := NewPicker(js, cfg, "python")
	shards := map[int]bool{}
	for range 30 {
		m, err := p.Next(ctx)
		if err != nil || m == nil {
			t.Fatalf("pick: %v %v", m, err)
		}
		subj := tenantOfMsg(t, m)
		if !want[subj] {
			t.Fatalf("%s picked twice or never queued", subj)
		}
		delete(want, subj)
		shards[ShardOf(tokenOf("python", subj), 3)] = true
		_ = m.DoubleAck(ctx)
	}
	if len(shards) != 3 {
		t.Fatalf("30 tenants used shards %v of 3", shards)
	}
	if n := consumerCount(t, js, job.ReadyStreamName); n != 3 {
		t.Fatalf("%d consumers of the ready stream for 30 tenants, want 3 (one per shard)", n)
	}
	if n := consumerCount(t, js, job.StreamName); n != 0 {
		t.Fatalf("%d consumers of the job stream, want none", n)
	}
}

func consumerCount(t *testing.T, js jetstream.JetStream, stream string) int {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range s.ConsumerNames(context.Background()).Name() {
		n++
	}
	return n
}

func mustWaiting(t *testing.T, l *Lister) []string {
	t.Helper()
	all, err := l.Waiting(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return all
}
