package worker

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/worker/egress"
)

// hammerRuntime serves each run's network with the worker's egress proxy
// and asks it for n plain-HTTP connections to host, which no allowlist
// has: past the job's connection cap the rest are refused for it.
func hammerRuntime(n int, host string) *requestRuntime {
	return &requestRuntime{Runtime: &testkit.Runtime{}, run: func(ctx context.Context, req sandboxapi.Request) (job.Result, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return job.Result{}, err
		}
		sctx, stop := context.WithCancel(ctx)
		served := make(chan *job.Egress, 1)
		go func() { served <- req.Network.Serve(sctx, ln) }()
		proxy, _ := url.Parse("http://" + ln.Addr().String())
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}
		for range n {
			resp, err := c.Get("http://" + host + "/hello")
			if err == nil {
				resp.Body.Close()
			}
		}
		stop()
		eg := <-served
		return job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Egress: eg, Image: testkit.ScriptedImage}, nil
	}}
}

// A job hammering its egress proxy adds a handful of audit records: its
// refusals for one host, port and reason fold into one record with a
// count, and those past its connection cap into one more; the result
// still counts every connection.
func TestHammeringTheProxyAddsAHandfulOfAuditRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 1000
	b.start(t, hammerRuntime(n, "refused.test"), nil)
	m := b.record(t, "hammer")
	b.publish(t, m)
	rec := b.waitTerminal(t, m.ID, time.Minute)
	if eg := rec.Result.Egress; eg == nil || eg.Connections != n || eg.Refused != n || len(eg.Records) != job.MaxEgressRecords {
		t.Fatalf("the result's egress: %+v", rec.Result.Egress)
	}
	recs, err := audit.Read(context.Background(), b.js, job.TenantOr(""), "", time.Time{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	counts := map[string]int64{}
	for _, r := range recs {
		kinds = append(kinds, string(r.Kind))
		if r.Kind == job.AuditEgress {
			counts[r.Egress.Reason] = r.Count
		}
	}
	t.Logf("%d connections, %d audit records: %v", n, len(recs), kinds)
	if len(recs) != 3 {
		t.Fatalf("%d audit records for %d refused connections: %v; want 3 (two folded egress records and the result)", len(recs), n, kinds)
	}
	capped := counts["kiln egress: this job may open at most 64 connections"]
	if capped != n-egress.MaxConnsDefault || len(counts) != 2 {
		t.Fatalf("egress records' counts %v; want %d past the cap and the first %d in one", counts, n-egress.MaxConnsDefault, egress.MaxConnsDefault)
	}
	for reason, c := range counts {
		if strings.Contains(reason, "not in this job's allowlist") && c != egress.MaxConnsDefault {
			t.Fatalf("refusals for the host: count %d, want %d", c, egress.MaxConnsDefault)
		}
	}
}

// A tenant at its audit bound: its records past it are not kept, one
// record says the bound was reached (once), and another tenant's records
// are all kept.
func TestATenantAtItsAuditBoundDoesNotAffectAnother(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.start(t, hammerRuntime(3, "refused.test"), nil)
	run := func(tenant string, q *job.TenantQuota) {
		m := b.record(t, "hammer")
		m.Tenant, m.Quota = tenant, q
		if err := b.store.DeleteJob(context.Background(), m.ID); err != nil {
			t.Fatal(err)
		}
		if err := b.store.CreateJob(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		b.publish(t, m)
		b.waitTerminal(t, m.ID, time.Minute)
	}
	// Each job makes two records (its folded refusals, its result): the
	// hog's bound of 3 a day keeps its first job's and half its second's.
	for range 3 {
		run("hog", &job.TenantQuota{AuditRecordsPerDay: 3})
		run("neighbour", nil)
	}
	read := func(tenant string) []job.AuditRecord {
		recs, err := audit.Read(context.Background(), b.js, tenant, "", time.Time{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	hog, neighbour := read("hog"), read("neighbour")
	var bound []job.AuditRecord
	for _, r := range hog {
		if r.Kind == job.AuditBoundReached {
			bound = append(bound, r)
		}
	}
	if len(hog) != 4 || len(bound) != 1 || !strings.Contains(bound[0].Detail, "audit_records_per_day=3") {
		t.Errorf("the hog's log: %d records, bound records %+v; want its 3 and one saying the bound was reached", len(hog), bound)
	}
	if len(neighbour) != 6 {
		t.Errorf("the neighbour's log: %d records, want all 6", len(neighbour))
	}
}
