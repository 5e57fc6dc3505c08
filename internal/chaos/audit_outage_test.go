package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// auditOutage is how long TestAuditSurvivesNATSOutage keeps NATS down.
const auditOutage = 10 * time.Second

// Issue 40, acceptance 8: every job that finished during a 10 s NATS
// outage has its result's audit record afterwards, once. The jobs end at
// different moments of the outage (each sleeps a second longer than the
// one before); a worker holds a run's records, trying again, until the
// stream stores them, and acks the job only then. Twice: with the NATS
// client's reconnect buffer, which on this embedded server carries a
// publish that timed out to the stream once the client reconnects (a real
// server restarting JetStream need not take it then), and without it,
// where nothing a failed attempt sent survives it.
func TestAuditSurvivesNATSOutage(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []nats.Option
	}{
		{"reconnect buffer", nil},
		{"no reconnect buffer", []nats.Option{nats.ReconnectBufSize(-1)}},
	} {
		t.Run(c.name, func(t *testing.T) { auditAcrossNATSOutage(t, c.opts) })
	}
}

func auditAcrossNATSOutage(t *testing.T, opts []nats.Option) {
	e := startOutageEnv(t)
	const jobs = 8
	nc, err := nats.Connect(e.nats.URL(), append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.startWorkerOn(t, nc, "outage-audit", jobs)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ids := make([]string, jobs)
	for i := range jobs {
		id, _, err := testenv.SubmitRetrying(ctx, e.api, py("import time\ntime.sleep(%d)\nprint(%d)", 2+i, i))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	testkit.Eventually(t, 30*time.Second, "every job to run", func() bool {
		for _, id := range ids {
			if rec, err := e.store.GetJob(ctx, id); err != nil || rec.Status != job.StatusRunning {
				return false
			}
		}
		return true
	})
	e.nats.Stop()
	stopped := time.Now()
	// NATS stays down until every job has ended (its record terminal in
	// Redis): the jobs end during the outage, their audit records waiting.
	testkit.Eventually(t, auditOutage, "every job to end while NATS is down", func() bool {
		for _, id := range ids {
			if rec, err := e.store.GetJob(ctx, id); err != nil || !rec.Status.Terminal() {
				return false
			}
		}
		return true
	})
	e.nats.Start()
	for i, id := range ids {
		v, err := e.api.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		if v.Status != job.StatusSucceeded || v.FinishedAt == nil {
			t.Fatalf("job %d: %+v", i, v.Result)
		}
		if d := v.FinishedAt.Sub(stopped); d < 0 || d > auditOutage {
			t.Errorf("job %d finished %v after NATS stopped: not during the outage", i, d)
		}
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	var recs []job.AuditRecord
	seen := map[string]int{}
	testkit.Eventually(t, 30*time.Second, "every job's result record in the audit log", func() bool {
		recs, err = audit.Read(ctx, js, job.TenantOr(""), job.AuditResult, time.Time{}, 1000)
		clear(seen)
		for _, r := range recs {
			seen[r.JobID]++
		}
		for _, id := range ids {
			if seen[id] == 0 {
				return false
			}
		}
		return err == nil
	})
	for i, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %d: %d result records, want 1", i, seen[id])
		}
	}
	t.Logf("%d jobs finished during a %v NATS outage; each has its result record", jobs, auditOutage)
}
