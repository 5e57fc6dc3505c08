package producer

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// Metadata comes back on every answer about a job (accepted, read, listed);
// listings page through a tenant's jobs
// by status and tag, newest first, and never show another tenant's.
func TestListJobsAndMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-alice": "alice", "k-bob": "bob"} })
	ctx := context.Background()
	as := func(key string) []string { return []string{"Authorization", "Bearer " + key} }

	var ids []string // alice's, oldest first
	for i, md := range []string{`{"team":"a"}`, `{"team":"b"}`, `{"team":"a","run":"r-7"}`, `{}`} {
		v := accepted(t, b.submit(t, `{"code":"print(`+string(rune('0'+i))+`)","cache":false,"metadata":`+md+`}`, as("k-alice")...))
		if md == `{"team":"a"}` && v.Metadata["team"] != "a" {
			t.Errorf("the 202 answer's metadata: %v", v.Metadata)
		}
		ids = append(ids, v.ID)
	}
	accepted(t, b.submit(t, `{"code":"print('bob')","metadata":{"team":"a"}}`, as("k-bob")...))

	// The first runs and succeeds.
	if _, err := b.worker(t, ctx, succeeded("0\n")); err != nil {
		t.Fatal(err)
	}
	var got resultView
	b.do(t, http.MethodGet, "/v1/jobs/"+ids[2], "", as("k-alice")...).decode(t, &got)
	if got.Metadata["run"] != "r-7" || got.Metadata["team"] != "a" {
		t.Errorf("GET the job: metadata %v", got.Metadata)
	}

	list := func(key, query string) job.JobPage {
		t.Helper()
		r := b.do(t, http.MethodGet, "/v1/jobs?"+query, "", as(key)...)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/jobs?%s: %d %s", query, r.StatusCode, r.body)
		}
		var p job.JobPage
		r.decode(t, &p)
		return p
	}
	idsOf := func(p job.JobPage) []string {
		var out []string
		for _, j := range p.Jobs {
			out = append(out, j.ID)
		}
		return out
	}
	all := idsOf(list("k-alice", "limit=100"))
	for _, id := range ids {
		if !slices.Contains(all, id) {
			t.Errorf("job %s not listed: %v", id, all)
		}
	}
	// Two at a time, newest first, the pages meeting exactly.
	var paged []string
	for q := "limit=2"; ; {
		p := list("k-alice", q)
		if len(p.Jobs) > 2 {
			t.Fatalf("a page of %d with limit 2", len(p.Jobs))
		}
		paged = append(paged, idsOf(p)...)
		if p.NextCursor == "" {
			break
		}
		q = "limit=2&cursor=" + p.NextCursor
	}
	if !slices.Equal(paged, all) {
		t.Errorf("pages %v; the whole list %v", paged, all)
	}
	if slices.Index(all, ids[3]) > slices.Index(all, ids[0]) {
		t.Errorf("not newest first: %v", all)
	}
	if got := idsOf(list("k-alice", "tag="+url.QueryEscape("team=a"))); !slices.Contains(got, ids[0]) || !slices.Contains(got, ids[2]) || slices.Contains(got, ids[1]) {
		t.Errorf("tag team=a: %v", got)
	}
	if got := idsOf(list("k-alice", "tag=team%3Da&tag=run%3Dr-7")); !slices.Equal(got, []string{ids[2]}) {
		t.Errorf("tags team=a and run=r-7: %v, want %v", got, ids[2:3])
	}
	p := list("k-alice", "status=succeeded")
	if len(p.Jobs) == 0 || p.Jobs[len(p.Jobs)-1].ID != ids[0] || p.Jobs[len(p.Jobs)-1].ExitCode == nil {
		t.Errorf("status succeeded: %+v", p.Jobs)
	}
	for _, j := range list("k-alice", "status=queued").Jobs {
		if j.Status != job.StatusQueued || j.ID == ids[0] {
			t.Errorf("status queued lists %s (%s)", j.ID, j.Status)
		}
	}
	// Bob sees his one job; Alice's never.
	bobs := list("k-bob", "tag=team%3Da")
	if len(bobs.Jobs) != 1 || slices.Contains(ids, bobs.Jobs[0].ID) {
		t.Errorf("bob's listing: %+v", bobs.Jobs)
	}
	// The ids form still answers as before.
	r := b.do(t, http.MethodGet, "/v1/jobs?ids="+ids[0]+","+ids[1], "", as("k-alice")...)
	var byID struct{ Jobs []resultView }
	r.decode(t, &byID)
	if r.StatusCode != http.StatusOK || len(byID.Jobs) != 2 || byID.Jobs[0].ID != ids[0] || byID.Jobs[1].Metadata["team"] != "b" {
		t.Errorf("GET /v1/jobs?ids=: %d %s", r.StatusCode, r.body)
	}
}

// A cache hit answers with the metadata its submission sent, never the
// entry's; and an identical job in flight is shared only when its
// metadata is the same.
func TestMetadataOfCacheHitsAndSharedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := accepted(t, b.submit(t, `{"code":"print(1)","metadata":{"team":"a"}}`))
	same := accepted(t, b.submit(t, `{"code":"print(1)","metadata":{"team":"a"}}`))
	other := accepted(t, b.submit(t, `{"code":"print(1)","metadata":{"team":"b"}}`))
	if same.ID != first.ID {
		t.Errorf("an identical job with the same metadata was not shared: %s, %s", first.ID, same.ID)
	}
	if other.ID == first.ID || other.Metadata["team"] != "b" {
		t.Errorf("an identical job with other metadata got %s %v; want its own job with its own metadata", other.ID, other.Metadata)
	}
	for range 2 {
		if _, err := b.worker(t, ctx, succeeded("1\n")); err != nil {
			t.Fatal(err)
		}
	}
	for _, md := range []string{"c", "d"} { // the second is a hit of an entry the API knows
		r := b.submit(t, `{"code":"print(1)","metadata":{"team":"`+md+`"}}`)
		var v resultView
		r.decode(t, &v)
		if r.StatusCode != http.StatusOK || !v.CacheHit || v.Metadata["team"] != md {
			t.Fatalf("a cache hit with team %s: %d %s", md, r.StatusCode, r.body)
		}
		var read resultView
		b.do(t, http.MethodGet, "/v1/jobs/"+v.ID, "", "").decode(t, &read)
		if read.Metadata["team"] != md {
			t.Errorf("the hit read back: metadata %v", read.Metadata)
		}
	}
}
