package audit

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// Records read back per tenant, in order, filtered by kind and time; a
// repeated append with the same message id is kept once.
func TestAppendAndRead(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if recs, err := Read(ctx, js, "alice", "", time.Time{}, 10); err != nil || len(recs) != 0 {
		t.Fatalf("before the stream exists: %v %v", recs, err)
	}
	if err := EnsureExists(ctx, js); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(ctx, js, Config{Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := EnsureExists(ctx, js); err != nil { // leaves the API's retention alone
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, job.AuditStreamName)
	if info, _ := s.Info(ctx); info.Config.MaxAge != time.Hour {
		t.Fatalf("retention %v after a worker's EnsureExists", info.Config.MaxAge)
	}
	t0 := time.Now().UTC()
	for i, r := range []struct {
		tenant string
		rec    job.AuditRecord
		id     string
	}{
		{"alice", job.AuditRecord{Kind: job.AuditSubmission, JobID: "j1", Time: t0}, ""},
		{"bob", job.AuditRecord{Kind: job.AuditSubmission, JobID: "b1", Time: t0}, ""},
		{"alice", job.AuditRecord{Kind: job.AuditResult, JobID: "j1", Time: t0.Add(time.Second)}, "result:j1"},
		{"alice", job.AuditRecord{Kind: job.AuditResult, JobID: "j1", Time: t0.Add(time.Second)}, "result:j1"},
		{"alice", job.AuditRecord{Kind: job.AuditCancel, JobID: "j2", Time: t0.Add(2 * time.Second)}, ""},
	} {
		if err := Append(ctx, js, r.tenant, r.rec, r.id); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	kinds := func(recs []job.AuditRecord) (out []string) {
		for _, r := range recs {
			out = append(out, string(r.Kind)+":"+r.JobID)
		}
		return out
	}
	all, err := Read(ctx, js, "alice", "", time.Time{}, 10)
	if err != nil || len(all) != 3 || kinds(all)[0] != "submission:j1" || kinds(all)[1] != "result:j1" || kinds(all)[2] != "cancel:j2" {
		t.Fatalf("alice's log: %v %v", kinds(all), err)
	}
	if r, _ := Read(ctx, js, "alice", job.AuditResult, time.Time{}, 10); len(r) != 1 {
		t.Fatalf("kind=result: %v", kinds(r))
	}
	if r, _ := Read(ctx, js, "alice", "", time.Time{}, 2); len(r) != 2 {
		t.Fatalf("limit 2: %v", kinds(r))
	}
	if r, _ := Read(ctx, js, "bob", "", time.Time{}, 10); len(r) != 1 || r[0].JobID != "b1" {
		t.Fatalf("bob's log: %v", kinds(r))
	}
}
