package producer

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// groupAudit puts a drain's records in one group per tenant and kind, but
// never publishes a record before one queued earlier without waiting (an
// answered cache hit, which may have caused it).
func TestGroupAuditKeepsCausalOrder(t *testing.T) {
	done := make(chan struct{})
	item := func(tenant string, kind job.AuditKind, id string, waits bool) auditItem {
		it := auditItem{tenant: tenant, rec: job.AuditRecord{Kind: kind, JobID: id}}
		if waits {
			it.done = done
		}
		return it
	}
	show := func(batch []auditItem, gs []auditGroup) string {
		var out []string
		for _, g := range gs {
			var ids []string
			for _, k := range g.items {
				ids = append(ids, batch[k].rec.JobID)
			}
			out = append(out, g.tenant+"/"+string(g.kind)+":"+strings.Join(ids, ","))
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		name  string
		batch []auditItem
		want  string
	}{
		{"hits of one tenant: one message", []auditItem{
			item("a", job.AuditSubmission, "1", false), item("a", job.AuditSubmission, "2", false), item("a", job.AuditSubmission, "3", false),
		}, "a/submission:1,2,3"},
		{"waiting records of tenants and kinds interleaved", []auditItem{
			item("a", job.AuditSubmission, "1", true), item("b", job.AuditSubmission, "2", true),
			item("a", job.AuditCancel, "3", true), item("a", job.AuditSubmission, "4", true), item("b", job.AuditSubmission, "5", true),
		}, "a/submission:1,4 b/submission:2,5 a/cancel:3"},
		{"nothing after a hit goes before it", []auditItem{
			item("a", job.AuditCancel, "1", true), item("a", job.AuditSubmission, "hit", false),
			item("a", job.AuditCancel, "2", true), item("a", job.AuditSubmission, "3", true),
		}, "a/cancel:1 a/submission:hit,3 a/cancel:2"},
		{"a hit of another tenant closes the first group", []auditItem{
			item("a", job.AuditSubmission, "1", true), item("b", job.AuditSubmission, "2", false),
			item("a", job.AuditSubmission, "3", true),
		}, "a/submission:1 b/submission:2 a/submission:3"},
		{"a hit closes the groups before its own only", []auditItem{
			item("a", job.AuditSubmission, "1", false), item("b", job.AuditSubmission, "2", true),
			item("a", job.AuditSubmission, "3", false), item("b", job.AuditSubmission, "4", true),
		}, "a/submission:1,3 b/submission:2,4"},
	} {
		if got := show(c.batch, groupAudit(c.batch)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// A record names the API key that made the request (audit.KeyID), never
// the key itself; two keys of one tenant are told apart.
func TestAuditRecordsNameTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-alice-1": "alice", "k-alice-2": "alice"} })
	accepted(t, b.submit(t, `{"code":"print(1)"}`, as("k-alice-1")...))
	accepted(t, b.submit(t, `{"code":"print(2)"}`, as("k-alice-2")...))
	var got struct {
		Records []job.AuditRecord `json:"records"`
	}
	testkit.Eventually(t, 5*time.Second, "two submission records", func() bool {
		b.do(t, http.MethodGet, "/v1/audit?kind=submission", "", as("k-alice-1")...).decode(t, &got)
		return len(got.Records) == 2
	})
	for i, want := range []string{audit.KeyID("k-alice-1"), audit.KeyID("k-alice-2")} {
		if got.Records[i].Key != want {
			t.Errorf("record %d names key %q, want %q", i, got.Records[i].Key, want)
		}
	}
}

// Issue 40, acceptance 2 (second half): a tenant at its audit bound gets
// its further records left out, with one record saying so, while another
// tenant's submissions are answered and recorded as ever.
func TestATenantAtItsAuditBoundLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-hog": "hog", "k-other": "other"}
		c.Tenants = map[string]Tenant{"hog": {Bounds: Bounds{AuditRecordsPerDay: 2}}}
	})
	for i := range 5 {
		accepted(t, b.submit(t, fmt.Sprintf(`{"code":"print(%d)","cache":false}`, i), as("k-hog")...))
		accepted(t, b.submit(t, fmt.Sprintf(`{"code":"print(%d)","cache":false}`, i), as("k-other")...))
	}
	read := func(key string) []job.AuditRecord {
		var got struct {
			Records []job.AuditRecord `json:"records"`
		}
		b.do(t, http.MethodGet, "/v1/audit", "", as(key)...).decode(t, &got)
		return got.Records
	}
	var other []job.AuditRecord
	testkit.Eventually(t, 5*time.Second, "the other tenant's five submission records", func() bool {
		other = read("k-other")
		return len(other) == 5
	})
	hog := read("k-hog")
	var kinds []string
	for _, r := range hog {
		kinds = append(kinds, string(r.Kind))
	}
	if strings.Join(kinds, ",") != "submission,submission,audit_bound" || !strings.Contains(hog[2].Detail, "audit_records_per_day=2") {
		t.Fatalf("the hog's log: %v (%+v); want two submissions and the bound's record", kinds, hog)
	}
}
