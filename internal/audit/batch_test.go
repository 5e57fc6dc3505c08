package audit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/job"
)

// Batched messages and one-record messages read back as one log: every
// record in the order it was appended, each with its own increasing Seq,
// filtered by kind, cut at the limit even inside a batch; a message id
// still keeps a repeated one-record append once.
func TestBatchesAndSingleRecordsReadAsOneLog(t *testing.T) {
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
	if _, err := Ensure(ctx, js, Config{}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC()
	sub := func(id string) job.AuditRecord {
		return job.AuditRecord{Kind: job.AuditSubmission, JobID: id, Time: t0, CacheHit: true}
	}
	publish := func(tenant string, kind job.AuditKind, recs ...job.AuditRecord) {
		t.Helper()
		msgs, err := BatchMsgs(tenant, kind, recs)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 1 || msgs[0].Header.Get(FormatHeader) != FormatLines {
			t.Fatalf("%d records: %d messages, format %q", len(recs), len(msgs), msgs[0].Header.Get(FormatHeader))
		}
		if _, err := js.PublishMsg(ctx, msgs[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := Append(ctx, js, "alice", sub("j1"), ""); err != nil { // the one-record format
		t.Fatal(err)
	}
	publish("alice", job.AuditSubmission, sub("j2"), sub("j3"), sub("j4"))
	publish("bob", job.AuditSubmission, sub("b1"), sub("b2"))
	for range 2 {
		if err := Append(ctx, js, "alice", job.AuditRecord{Kind: job.AuditResult, JobID: "j2", Time: t0}, "result:j2"); err != nil {
			t.Fatal(err)
		}
	}
	publish("alice", job.AuditSubmission, sub("j5"))
	ids := func(recs []job.AuditRecord) string {
		var out []string
		for _, r := range recs {
			out = append(out, string(r.Kind)+":"+r.JobID)
		}
		return strings.Join(out, " ")
	}
	all, err := Read(ctx, js, "alice", "", time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(all), "submission:j1 submission:j2 submission:j3 submission:j4 result:j2 submission:j5"; got != want {
		t.Fatalf("alice's log:\n got %s\nwant %s", got, want)
	}
	for i, r := range all {
		if i > 0 && r.Seq <= all[i-1].Seq {
			t.Fatalf("seq %d after %d: %s", r.Seq, all[i-1].Seq, ids(all))
		}
		if r.Kind == job.AuditSubmission && (!r.CacheHit || !r.Time.Equal(t0)) {
			t.Fatalf("record %d lost fields: %+v", i, r)
		}
	}
	if all[1].Seq != all[0].Seq+SeqStride || all[2].Seq != all[1].Seq+1 {
		t.Fatalf("seqs %d %d %d: want a message's stream sequence × %d + the record's index", all[0].Seq, all[1].Seq, all[2].Seq, SeqStride)
	}
	if r, _ := Read(ctx, js, "alice", job.AuditResult, time.Time{}, 100); ids(r) != "result:j2" {
		t.Fatalf("kind=result: %s", ids(r))
	}
	if r, _ := Read(ctx, js, "alice", "", time.Time{}, 3); ids(r) != "submission:j1 submission:j2 submission:j3" {
		t.Fatalf("limit 3: %s", ids(r))
	}
	if r, _ := Read(ctx, js, "bob", "", time.Time{}, 100); ids(r) != "submission:b1 submission:b2" {
		t.Fatalf("bob's log: %s", ids(r))
	}

	// A format this build does not know is an error, not a silent gap.
	m := nats.NewMsg(job.AuditSubject("carol", job.AuditSubmission))
	m.Header.Set(FormatHeader, "cbor")
	m.Data = []byte{0xa0}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, js, "carol", "", time.Time{}, 100); err == nil || !strings.Contains(err.Error(), "cbor") {
		t.Fatalf("unknown format: %v", err)
	}
}

// BatchMsgs splits at MaxBatch records and at the size bound, keeps the
// records' order, and refuses a record of another kind.
func TestBatchMsgsSplits(t *testing.T) {
	var recs []job.AuditRecord
	for i := range MaxBatch + 3 {
		recs = append(recs, job.AuditRecord{Kind: job.AuditSubmission, JobID: fmt.Sprint(i)})
	}
	msgs, err := BatchMsgs("alice", job.AuditSubmission, recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || strings.Count(string(msgs[0].Data), "\n") != MaxBatch || strings.Count(string(msgs[1].Data), "\n") != 3 {
		t.Fatalf("%d records: %d messages", len(recs), len(msgs))
	}
	if !strings.Contains(string(msgs[1].Data), `"job_id":"514"`) || msgs[0].Subject != job.AuditSubject("alice", job.AuditSubmission) {
		t.Fatalf("second message: %s %s", msgs[1].Subject, msgs[1].Data)
	}
	big := strings.Repeat("x", maxBatchBytes/3)
	recs = []job.AuditRecord{{Kind: job.AuditCancel, Detail: big}, {Kind: job.AuditCancel, Detail: big}, {Kind: job.AuditCancel, Detail: big}, {Kind: job.AuditCancel, JobID: "small"}}
	if msgs, err = BatchMsgs("alice", job.AuditCancel, recs); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || strings.Count(string(msgs[0].Data), "\n") != 2 || strings.Count(string(msgs[1].Data), "\n") != 2 {
		t.Fatalf("three records of a third of the bound and a small one: %d messages", len(msgs))
	}
	for _, m := range msgs {
		if len(m.Data) > maxBatchBytes {
			t.Fatalf("a message of %d bytes", len(m.Data))
		}
	}
	if _, err := BatchMsgs("alice", job.AuditCancel, []job.AuditRecord{{Kind: job.AuditResult}}); err == nil {
		t.Fatal("a result record in a batch of cancels was accepted")
	}
}
