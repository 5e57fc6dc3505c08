package producer

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// overQuota asserts a 429 naming quota q with a Retry-After between 1s and max.
func overQuota(t *testing.T, r response, q job.Quota, maxRetry time.Duration) {
	t.Helper()
	p := r.problem(t, http.StatusTooManyRequests)
	if p.Type != job.QuotaProblemType(q) {
		t.Fatalf("problem type %q, want %q: %s", p.Type, job.QuotaProblemType(q), r.body)
	}
	secs, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || secs < 1 || time.Duration(secs)*time.Second > maxRetry {
		t.Fatalf("Retry-After %q, want 1s..%v", r.Header.Get("Retry-After"), maxRetry)
	}
}

func withQuota(q Quota) func(*Config) {
	return twoTenants(func(c *Config) { c.Tenants = map[string]Tenant{"alice": {Quota: q}} })
}

func TestSubmissionsPerSecondQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, withQuota(Quota{SubmissionsPerSecond: 0.5, Burst: 2}))
	for i := range 2 {
		accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)"}`, as(aliceKey)...))
	}
	overQuota(t, b.submit(t, `{"code":"print(3)"}`, as(aliceKey)...), job.QuotaRate, 3*time.Second)
	// Bob has no quota and is not affected by alice's.
	for i := range 5 {
		accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)"}`, as(bobKey)...))
	}
}

func TestQueuedJobsQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, withQuota(Quota{MaxQueued: 2}))
	for i := range 2 {
		accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)"}`, as(aliceKey)...))
	}
	r := b.submit(t, `{"code":"print(3)"}`, as(aliceKey)...)
	overQuota(t, r, job.QuotaQueued, time.Minute)
	if b.streamMsgs(t) != 2 {
		t.Fatalf("%d messages queued, want 2", b.streamMsgs(t))
	}
	accepted(t, b.submit(t, `{"code":"print(3)"}`, as(bobKey)...))
	// A job leaving the queue makes room.
	if _, err := b.worker(t, context.Background(), succeeded("ok\n")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the worker may have taken bob's job
		if r := b.submit(t, `{"code":"print(4)"}`, as(aliceKey)...); r.StatusCode == http.StatusAccepted {
			return
		}
		if _, err := b.worker(t, context.Background(), succeeded("ok\n")); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("alice's queue never made room")
}

func TestCPUSecondsPerDayQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, withQuota(Quota{CPUSecondsPerDay: 2}))
	ctx := context.Background()
	accepted(t, b.submit(t, `{"code":"print(1)"}`, as(aliceKey)...))
	// Workers charge each finished job's cpu_ms.
	if err := b.store.SettleCPU(ctx, "alice", "job-x", 2500*time.Millisecond, time.Now()); err != nil {
		t.Fatal(err)
	}
	overQuota(t, b.submit(t, `{"code":"print(2)"}`, as(aliceKey)...), job.QuotaCPUDay, 24*time.Hour)
	accepted(t, b.submit(t, `{"code":"print(2)"}`, as(bobKey)...))
}

func TestRunningJobsQuotaHoldsJobsInTheQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, withQuota(Quota{MaxRunning: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)"}`, as(aliceKey)...))
	}
	p := queue.NewPicker(b.js, queue.Config{}, "python")
	first, err := p.Next(ctx)
	if err != nil || first == nil {
		t.Fatalf("first job: %v %v", first, err)
	}
	// Alice's first job runs (unacked): her second must wait, fleet-wide.
	if m, err := p.Next(ctx); m != nil {
		t.Fatalf("a second job of alice was delivered while one runs (err %v)", err)
	}
	if m, _ := queue.NewPicker(b.js, queue.Config{}, "python").Next(ctx); m != nil {
		t.Fatal("another worker got alice's second job while one runs")
	}
	// Bob's job is not held by alice's bound.
	accepted(t, b.submit(t, `{"code":"print('bob')"}`, as(bobKey)...))
	if m, err := p.Next(ctx); err != nil || m == nil || backlogOf(m) != job.TenantJobSubject("python", "bob") {
		t.Fatalf("bob's job: %v %v", m, err)
	}
	if err := first.Ack(); err != nil {
		t.Fatal(err)
	}
	var second jetstream.Msg
	for second == nil && ctx.Err() == nil {
		second, _ = p.Next(ctx)
	}
	if second == nil || backlogOf(second) != job.TenantJobSubject("python", "alice") {
		t.Fatalf("alice's second job after her first ended: %v", second)
	}
}

// backlogOf is the tenant's backlog subject a job was taken from.
func backlogOf(m jetstream.Msg) string {
	subj, _ := queue.BacklogSubjectOf(m.Subject())
	return subj
}
