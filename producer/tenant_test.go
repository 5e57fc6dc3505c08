package producer

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

const (
	aliceKey = "alice-key-0123456789"
	bobKey   = "bob-key-0123456789"
	carolKey = "carol-key-0123456789"
)

func twoTenants(mod ...func(*Config)) func(*Config) {
	return func(c *Config) {
		c.APIKeys = map[string]string{aliceKey: "alice", bobKey: "bob", carolKey: "carol"}
		for _, m := range mod {
			m(c)
		}
	}
}

func as(key string) []string { return []string{"Authorization", "Bearer " + key} }

// notFoundBody is the problem a truly unknown id gets, with id in place of
// that id, so a foreign job's 404 can be compared byte for byte.
func (b *bundle) notFoundBody(t *testing.T, key, method, id string) string {
	t.Helper()
	unknown := job.NewID()
	r := b.do(t, method, "/v1/jobs/"+unknown, "", as(key)...)
	r.problem(t, http.StatusNotFound)
	return strings.ReplaceAll(string(r.body), unknown, id)
}

func TestATenantCannotSeeOrTouchAnotherTenantsJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, twoTenants())
	v := accepted(t, b.submit(t, `{"code":"print('alice')"}`, as(aliceKey)...))

	for _, rt := range []struct{ method, path string }{
		{http.MethodGet, "/v1/jobs/" + v.ID},
		{http.MethodGet, "/v1/jobs/" + v.ID + "?wait=5s"},
		{http.MethodDelete, "/v1/jobs/" + v.ID},
	} {
		start := time.Now()
		r := b.do(t, rt.method, rt.path, "", as(bobKey)...)
		r.problem(t, http.StatusNotFound)
		if want := b.notFoundBody(t, bobKey, rt.method, v.ID); string(r.body) != want {
			t.Fatalf("%s %s as bob: body %s, want the unknown-id body %s", rt.method, rt.path, r.body, want)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s %s as bob waited %v: a foreign job must be answered at once", rt.method, rt.path, time.Since(start))
		}
	}
	var list struct {
		Jobs []struct {
			ID    string       `json:"id"`
			Error *problemBody `json:"error"`
		} `json:"jobs"`
	}
	b.do(t, http.MethodGet, "/v1/jobs?ids="+v.ID, "", as(bobKey)...).decode(t, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].Error == nil || list.Jobs[0].Error.Status != 404 {
		t.Fatalf("bob's list of alice's job: %+v", list)
	}
	// Alice still sees her job, untouched by bob's DELETE.
	var got pendingView
	r := b.do(t, http.MethodGet, "/v1/jobs/"+v.ID, "", as(aliceKey)...)
	r.decode(t, &got)
	if r.StatusCode != 200 || got.Status != job.StatusQueued || got.CancelRequested {
		t.Fatalf("alice's view after bob's cancel: %d %s", r.StatusCode, r.body)
	}
}

func TestNoCrossTenantCacheHitCoalescingOrIdempotencyMatch(t *testing.T) {
	t.Parallel()
	b := setup(t, twoTenants())
	ctx := context.Background()

	// Coalescing: bob's identical submission while alice's job is queued
	// gets a job of its own; alice's second one joins her first.
	a1 := accepted(t, b.submit(t, `{"code":"print('same')"}`, as(aliceKey)...))
	b1 := accepted(t, b.submit(t, `{"code":"print('same')"}`, as(bobKey)...))
	if b1.ID == a1.ID {
		t.Fatal("bob's submission was coalesced onto alice's job")
	}
	if a2 := accepted(t, b.submit(t, `{"code":"print('same')"}`, as(aliceKey)...)); a2.ID != a1.ID {
		t.Fatalf("alice's identical submission got %s, want her in-flight job %s", a2.ID, a1.ID)
	}

	// Result cache: once alice's job has run, alice gets a hit and bob,
	// with an identical spec, does not.
	for range 2 {
		if _, err := b.worker(t, ctx, succeeded("alice's secret\n")); err != nil {
			t.Fatal(err)
		}
	}
	hit := b.submit(t, `{"code":"print('same')"}`, as(aliceKey)...)
	var res resultView
	hit.decode(t, &res)
	if hit.StatusCode != 200 || !res.CacheHit {
		t.Fatalf("alice's resubmission: %d %s, want a cache hit", hit.StatusCode, hit.body)
	}
	carol := b.submit(t, `{"code":"print('same')"}`, as(carolKey)...)
	if carol.StatusCode != http.StatusAccepted || strings.Contains(string(carol.body), "secret") {
		t.Fatalf("carol's identical submission: %d %s, want a fresh 202", carol.StatusCode, carol.body)
	}

	// Idempotency-Key: the same key from two tenants names two jobs, and
	// bob reusing alice's key with another body is no conflict.
	ka := accepted(t, b.submit(t, `{"code":"print('idem')"}`, append(as(aliceKey), "Idempotency-Key", "k-1")...))
	kb := b.submit(t, `{"code":"print('idem')","cache":false}`, append(as(bobKey), "Idempotency-Key", "k-1")...)
	if v := accepted(t, kb); v.ID == ka.ID {
		t.Fatal("bob's Idempotency-Key matched alice's")
	}
	if v := accepted(t, b.submit(t, `{"code":"print('idem')"}`, append(as(aliceKey), "Idempotency-Key", "k-1")...)); v.ID != ka.ID {
		t.Fatalf("alice's retry got %s, want %s", v.ID, ka.ID)
	}
}

func TestCacheGroupSharesResultsButNotJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, twoTenants(func(c *Config) {
		c.Tenants = map[string]Tenant{"alice": {CacheGroup: "team"}, "bob": {CacheGroup: "team"}}
	}))
	ctx := context.Background()
	a := accepted(t, b.submit(t, `{"code":"print('shared')"}`, as(aliceKey)...))
	// In flight: bob runs his own job rather than get alice's id.
	if v := accepted(t, b.submit(t, `{"code":"print('shared')"}`, as(bobKey)...)); v.ID == a.ID {
		t.Fatal("bob was handed alice's job id")
	}
	for range 2 {
		if _, err := b.worker(t, ctx, succeeded("shared\n")); err != nil {
			t.Fatal(err)
		}
	}
	r := b.submit(t, `{"code":"print('shared')"}`, as(bobKey)...)
	var res resultView
	r.decode(t, &res)
	if r.StatusCode != 200 || !res.CacheHit {
		t.Fatalf("bob in alice's cache group: %d %s, want a cache hit", r.StatusCode, r.body)
	}
	if c := b.submit(t, `{"code":"print('shared')"}`, as(carolKey)...); c.StatusCode != http.StatusAccepted {
		t.Fatalf("carol, outside the group: %d %s, want 202", c.StatusCode, c.body)
	}
	b.do(t, http.MethodGet, "/v1/jobs/"+a.ID, "", as(bobKey)...).problem(t, http.StatusNotFound)
}

func TestCacheServesOnlyResultsYoungerThanMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.CacheMaxAge = 90 * time.Second })
	ctx := context.Background()
	spec := job.Spec{Runtime: "python", Code: "import datetime; print(datetime.datetime.now())"}
	var err error
	if spec.Limits, err = job.DefaultPolicy().Resolve(spec.Limits); err != nil {
		t.Fatal(err)
	}
	key := job.ScopedKey("tenant:"+job.DefaultTenant, spec, testDigest)
	finished := time.Now().Add(-2 * time.Minute).UTC()
	res := job.Result{ID: job.NewID(), Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), FinishedAt: &finished}
	res.SetOutput([]byte("two minutes ago\n"), nil)
	if err := b.store.StoreResult(ctx, key, res); err != nil {
		t.Fatal(err)
	}
	code := jsonBody(t, spec.Code)
	for _, tc := range []struct {
		cache string
		hit   bool
	}{
		{`true`, false},                // server default 90s < 2m
		{`{"max_age_s": 60}`, false},   // the client wants fresher
		{`{"max_age_s": 300}`, true},   // the client accepts 5 minutes
		{`{"max_age_s": 86400}`, true}, // and a day
	} {
		r := b.submit(t, `{"code":`+strings.TrimSpace(code)+`,"cache":`+tc.cache+`}`)
		if hit := r.StatusCode == 200 && strings.Contains(string(r.body), "two minutes ago"); hit != tc.hit {
			t.Fatalf("cache %s: %d %s; want hit=%v", tc.cache, r.StatusCode, r.body, tc.hit)
		}
	}
}

func TestTenantMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, twoTenants(func(c *Config) { c.MetricsTenants = 2 }))
	for name, want := range map[string]string{
		"alice": "alice", "bob": "bob", "carol": otherTenant, job.DefaultTenant: job.DefaultTenant, "stranger": otherTenant,
	} {
		if got := b.srv.tmetrics.label(name); got != want {
			t.Errorf("tenant %q counted as %q, want %q", name, got, want)
		}
	}
}
