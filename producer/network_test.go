package producer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
)

// networkSetup serves two tenants: alice, whose key allows api.example.org
// and *.data.gov on 443, and bob, whose key allows no network. Requests go
// as alice unless they pass bobNoNet.
func networkSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, func(c *Config) {
		c.APIKeys = map[string]string{"k-alice": "alice", "k-bob": "bob"}
		c.Tenants = map[string]Tenant{
			"alice": {Egress: egressrule.Rules{{Host: "api.example.org"}, {Host: "*.data.gov", Port: 443}}},
			"bob":   {},
		}
	})
	b.apiKey = "k-alice"
	return b
}

var bobNoNet = []string{"Authorization", "Bearer k-bob"}

func TestNetworkAllowlistStaysWithinTheKeysAllowance(t *testing.T) {
	t.Parallel()
	b := networkSetup(t)

	for _, tc := range []struct {
		name, allow string
		bob         bool
		status      int
		typ, field  string
		detail      []string
	}{
		{name: "host outside the allowance", allow: `["api.example.org","evil.example.net"]`, status: 422, typ: string(job.ProblemEgressNotAllowed), field: "network.allow[1]",
			detail: []string{"evil.example.net", "not within this key's egress allowance (api.example.org, *.data.gov:443)"}},
		{name: "both ports where the key allows 443", allow: `["x.data.gov"]`, status: 422, typ: string(job.ProblemEgressNotAllowed), field: "network.allow[0]",
			detail: []string{"x.data.gov", "port 443 only", "write x.data.gov:443"}},
		{name: "the suffix itself", allow: `["data.gov:443"]`, status: 422, typ: string(job.ProblemEgressNotAllowed), field: "network.allow[0]", detail: []string{"data.gov:443"}},
		{name: "a suffix where the key allows one name", allow: `["*.example.org"]`, status: 422, typ: string(job.ProblemEgressNotAllowed), field: "network.allow[0]", detail: []string{"*.example.org"}},
		{name: "a wider suffix", allow: `["*.gov:443"]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[0]", detail: []string{"DNS name"}},
		{name: "a key without network", allow: `["api.example.org"]`, bob: true, status: 422, typ: string(job.ProblemEgressNotAllowed), field: "network.allow[0]",
			detail: []string{"this API key allows no network", "api.example.org", "remove \"network\""}},
		{name: "an address", allow: `["10.0.0.1"]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[0]", detail: []string{"name a host, not an address"}},
		{name: "a bad port", allow: `["api.example.org:70000"]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[0]", detail: []string{"port"}},
		{name: "an empty entry", allow: `["api.example.org",""]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[1]", detail: []string{"empty"}},
		{name: "two hosts in one entry", allow: `["api.example.org,x.data.gov:443"]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[0]", detail: []string{"one host per entry"}},
		{name: "a bare wildcard", allow: `["*"]`, status: 422, typ: string(job.ProblemInvalidField), field: "network.allow[0]", detail: []string{"DNS name"}},
	} {
		var hdr []string
		if tc.bob {
			hdr = bobNoNet
		}
		p := b.submit(t, `{"code":"print(1)","network":{"allow":`+tc.allow+`}}`, hdr...).problem(t, tc.status)
		if p.Type != tc.typ || p.Field != tc.field {
			t.Errorf("%s: type %s field %q, want %s %q (%s)", tc.name, p.Type, p.Field, tc.typ, tc.field, p.Detail)
		}
		for _, d := range tc.detail {
			if !strings.Contains(p.Detail, d) {
				t.Errorf("%s: detail %q does not say %q", tc.name, p.Detail, d)
			}
		}
	}
	too := make([]string, job.MaxNetworkAllow+1)
	for i := range too {
		too[i] = `"api.example.org"`
	}
	if p := b.submit(t, `{"code":"1","network":{"allow":[`+strings.Join(too, ",")+`]}}`).problem(t, 422); p.Field != "network.allow" {
		t.Errorf("%d entries: %+v", len(too), p)
	}
	if p := b.submit(t, `{"code":"1","network":{"hosts":["api.example.org"]}}`).problem(t, 400); p.Field != "network.hosts" {
		t.Errorf("unknown member of network: %+v", p)
	}
	if p := b.submit(t, `{"code":"1","network":{"Allow":["api.example.org"]}}`).problem(t, 400); p.Type != string(job.ProblemFieldNameCase) {
		t.Errorf("network.Allow: %+v", p)
	}
	if n := b.streamMsgs(t); n != 0 {
		t.Fatalf("refused jobs published %d messages", n)
	}

	// In batches, each job is checked on its own.
	r := b.do(t, http.MethodPost, "/v1/jobs/batch", `{"jobs":[{"code":"1","network":{"allow":["evil.example.net"]}},{"code":"2"}]}`)
	var out struct {
		Jobs []struct {
			Status int          `json:"status"`
			Error  *problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &out)
	if len(out.Jobs) != 2 || out.Jobs[0].Status != 422 || out.Jobs[0].Error == nil || out.Jobs[0].Error.Type != string(job.ProblemEgressNotAllowed) ||
		out.Jobs[0].Error.Field != "jobs[0].network.allow[0]" || out.Jobs[1].Status != 202 {
		t.Fatalf("batch: %s", r.body)
	}
	if n := b.streamMsgs(t); n != 1 {
		t.Fatalf("the batch published %d messages, want 1", n)
	}
}

// The worker gets the allowlist in canonical form: rules as the egress
// package writes them, sorted, without repeats; an empty one is no network.
func TestNetworkAllowlistReachesTheWorkerCanonical(t *testing.T) {
	t.Parallel()
	b := networkSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	accepted(t, b.submit(t, `{"code":"print(1)","network":{"allow":["X.Data.Gov.:443","API.example.org","api.example.org","a.b.data.gov:443"]}}`))
	msg, err := b.worker(t, ctx, succeeded(""))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.b.data.gov:443", "api.example.org", "x.data.gov:443"}
	if msg.Spec.Network == nil || !slices.Equal(msg.Spec.Network.Allow, want) {
		t.Fatalf("the worker got network %+v, want allow %v", msg.Spec.Network, want)
	}

	// A spec too large for one message goes by reference; the message
	// still carries the network, which the worker decides on first.
	big := strings.Repeat("x", 2<<20)
	accepted(t, b.submit(t, `{"code":"print(1)","stdin":"`+big+`","network":{"allow":["api.example.org"]}}`))
	if msg, err = b.worker(t, ctx, succeeded("")); err != nil {
		t.Fatal(err)
	}
	if msg.SpecRef == nil || msg.Spec.Network == nil || !slices.Equal(msg.Spec.Network.Allow, []string{"api.example.org"}) {
		t.Fatalf("by reference: spec ref %v, network %+v", msg.SpecRef, msg.Spec.Network)
	}

	for _, body := range []string{`{"code":"print(2)","network":{"allow":[]}}`, `{"code":"print(3)","network":{}}`} {
		accepted(t, b.submit(t, body, bobNoNet...)) // no allowance needed for no network
		msg, err := b.worker(t, ctx, succeeded(""))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Spec.Network != nil {
			t.Fatalf("%s: the worker got network %+v, want none", body, msg.Spec.Network)
		}
	}
}

// A job with a network is neither answered from the cache, nor stored in
// it, nor coalesced, unless it sends a cache policy; the allowlist is part
// of its key.
func TestNetworkJobsUseTheCacheOnlyWhenTheyAsk(t *testing.T) {
	t.Parallel()
	b := networkSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := func() job.Message {
		t.Helper()
		msg, err := b.worker(t, ctx, succeeded("fetched\n"))
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	hit := func(body string) {
		t.Helper()
		r := b.submit(t, body)
		var res job.Result
		if r.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d, want 200 (a cache hit): %s", body, r.StatusCode, r.body)
		}
		if r.decode(t, &res); !res.CacheHit || res.Stdout != "fetched\n" {
			t.Fatalf("%s: %s, want a cache hit", body, r.body)
		}
	}
	miss := func(body string) pendingView {
		t.Helper()
		n := b.streamMsgs(t)
		v := accepted(t, b.submit(t, body))
		if b.streamMsgs(t) != n+1 {
			t.Fatalf("%s: not published", body)
		}
		return v
	}

	// Asked for: stored, then answered; the allowlist's spelling does not
	// matter, its canonical form does.
	const asked = `{"code":"print(1)","cache":true,"network":{"allow":["api.example.org"]}}`
	miss(asked)
	run()
	hit(asked)
	hit(`{"code":"print(1)","cache":{"max_age_s":600},"network":{"allow":["API.example.org.","api.example.org"]}}`)
	// Another allowlist, or none, is another key.
	miss(`{"code":"print(1)","cache":true,"network":{"allow":["api.example.org","x.data.gov:443"]}}`)
	run()
	miss(`{"code":"print(1)"}`)
	run()

	// Not asked for: the same job always runs, though its result is cached.
	const unasked = `{"code":"print(1)","network":{"allow":["api.example.org"]}}`
	miss(unasked)
	if msg := run(); msg.Spec.CacheEnabled() {
		t.Fatalf("a network job without a cache policy went to the worker as cacheable: %+v", msg.Spec)
	}
	// ... and what it ran is not stored.
	miss(`{"code":"print(2)","network":{"allow":["api.example.org"]}}`)
	run()
	miss(`{"code":"print(2)","cache":true,"network":{"allow":["api.example.org"]}}`)
	run()
	// ... nor shared with an identical job in flight.
	a, c := miss(unasked), miss(unasked)
	if a.ID == c.ID {
		t.Fatalf("two network jobs without a cache policy were coalesced into %s", a.ID)
	}
}

func TestTenantEgressRulesAreValidated(t *testing.T) {
	t.Parallel()
	for _, bad := range []egressrule.Rules{{{Host: "10.0.0.1"}}, {{Host: "API.example.org"}}, {{Host: "api.example.org", Port: 70000}}} {
		if err := (Tenant{Egress: bad}).Validate(); err == nil {
			t.Errorf("allowance %v accepted", bad)
		}
	}
	if err := (Tenant{Egress: egressrule.Rules{{Host: "api.example.org"}, {Host: "*.data.gov", Port: 443}}}).Validate(); err != nil {
		t.Errorf("a good allowance: %v", err)
	}
}

// A replay is checked as a new submission: against the key's allowance as
// it is now, not as it was when the job ran.
func TestReplayChecksTheAllowlistAgain(t *testing.T) {
	t.Parallel()
	b := networkSetup(t)
	v := accepted(t, b.submit(t, `{"code":"print(1)","network":{"allow":["api.example.org"]}}`))
	if _, err := b.worker(t, context.Background(), func(job.Message) job.Result {
		r := succeeded("1\n")(job.Message{})
		r.Image = job.Image{Name: "kiln/python:3", Digest: testDigest}
		return r
	}); err != nil {
		t.Fatal(err)
	}
	accepted(t, b.do(t, http.MethodPost, "/v1/jobs/"+v.ID+"/replay", ""))

	// The operator narrows alice's allowance: a server started with the new key file.
	narrowed, err := New(context.Background(), Config{Store: b.store, NATS: b.nc, JetStream: b.js, RuntimeCacheTTL: 50 * time.Millisecond,
		APIKeys: map[string]string{"k-alice": "alice"},
		Tenants: map[string]Tenant{"alice": {Egress: egressrule.Rules{{Host: "*.data.gov", Port: 443}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(narrowed.Close)
	hs := httptest.NewServer(narrowed.Handler())
	t.Cleanup(hs.Close)
	b2 := *b
	b2.http = hs
	p := b2.do(t, http.MethodPost, "/v1/jobs/"+v.ID+"/replay", "").problem(t, http.StatusUnprocessableEntity)
	if p.Type != string(job.ProblemEgressNotAllowed) || !strings.Contains(p.Detail, "api.example.org") || !strings.Contains(p.Detail, "*.data.gov:443") {
		t.Fatalf("replay outside the narrowed allowance: %+v", p)
	}
}
