package producer

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// TestRuntimeContractFromWorkers: what a worker advertises of a runtime
// (language, version, packages, main file, reserved names, default limits)
// is what GET /v1/runtimes shows and what submission checks.
func TestRuntimeContractFromWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	node := job.RuntimeInfo{Name: "node", Image: "kiln.local/node:latest", Digest: testDigest, Limits: job.DefaultPolicy(),
		RuntimeContract: job.RuntimeContract{
			Language: "javascript", Version: "18.20.4", MainFile: "main.js", ReservedFiles: []string{"main.mjs"},
			ReservedEnv: []string{"NODE_OPTIONS"}, DefaultLimits: job.Limits{MemoryMB: 512},
			Packages: []job.Package{{Name: "node:fs", Version: "18.20.4", Modules: []string{"fs"}}},
		}}
	if err := b.store.RegisterRuntime(context.Background(), node, time.Hour); err != nil {
		t.Fatal(err)
	}
	var got struct{ Runtimes []job.RuntimeInfo }
	b.do(t, http.MethodGet, "/v1/runtimes", "").decode(t, &got)
	var seen *job.RuntimeInfo
	for i := range got.Runtimes {
		if got.Runtimes[i].Name == "node" {
			seen = &got.Runtimes[i]
		}
	}
	if seen == nil || seen.Version != "18.20.4" || seen.MainFile != "main.js" || len(seen.Packages) != 1 || seen.Packages[0].Modules[0] != "fs" ||
		seen.Limits.Default.MemoryMB != 512 {
		t.Fatalf("node in GET /v1/runtimes: %+v", seen)
	}

	for _, tc := range []struct{ body, field, want string }{
		{`{"runtime":"node","code":"1","files":[{"name":"main.js","content":"x"}]}`, "files[0].name", "reserved for the program itself in runtime node"},
		{`{"runtime":"node","code":"1","files":[{"name":"main.mjs","content":"x"}]}`, "files[0].name", "reserved"},
		{`{"runtime":"node","code":"1","env":{"NODE_OPTIONS":"--inspect"}}`, "env", "NODE_OPTIONS is set by the node runtime's sandbox"},
	} {
		p := b.do(t, http.MethodPost, "/v1/jobs", tc.body).problem(t, http.StatusUnprocessableEntity)
		if p.Field != tc.field || !strings.Contains(p.Detail, tc.want) {
			t.Errorf("%s: problem field %q detail %q; want %q containing %q", tc.body, p.Field, p.Detail, tc.field, tc.want)
		}
	}
	// What node reserves, python allows: a data file called main.js.
	if r := b.do(t, http.MethodPost, "/v1/jobs", `{"runtime":"python","code":"1","files":[{"name":"main.js","content":"x"}]}`); r.StatusCode != http.StatusAccepted {
		t.Fatalf("python job with a main.js input file: %d %s", r.StatusCode, r.body)
	}
	// A node job without a memory limit gets the runtime's default.
	r := b.do(t, http.MethodPost, "/v1/jobs", `{"runtime":"node","code":"console.log(1)"}`)
	if r.StatusCode != http.StatusAccepted {
		t.Fatalf("node job: %d %s", r.StatusCode, r.body)
	}
}

// A runtime whose workers say they host no sessions is refused a session
// at creation with a 422 naming the runtimes that have them (never a 503
// to retry), and GET /v1/runtimes says which have them.
func TestSessionOfARuntimeWithoutSessionsIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	yes, no := true, false
	for _, info := range []job.RuntimeInfo{
		{Name: "python", Image: "kiln/python:3", Digest: testDigest, Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Sessions: &yes}},
		{Name: "node", Image: "kiln/node:20", Digest: testDigest, Limits: job.DefaultPolicy(), RuntimeContract: job.RuntimeContract{Sessions: &no}},
	} {
		if err := b.store.RegisterRuntime(context.Background(), info, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	p := b.do(t, http.MethodPost, "/v1/sessions", `{"runtime":"node"}`).problem(t, http.StatusUnprocessableEntity)
	if p.Field != "runtime" || !strings.Contains(p.Detail, `"node" has no sessions`) || !strings.Contains(p.Detail, "python") || strings.Contains(p.Detail, ": node") {
		t.Fatalf("a node session: field %q detail %q; want the runtime refused, naming python", p.Field, p.Detail)
	}
	var got struct{ Runtimes []job.RuntimeInfo }
	b.do(t, http.MethodGet, "/v1/runtimes", "").decode(t, &got)
	for _, rt := range got.Runtimes {
		if want := rt.Name == "python"; rt.Sessions == nil || *rt.Sessions != want {
			t.Errorf("GET /v1/runtimes: %s sessions %v, want %v", rt.Name, rt.Sessions, want)
		}
	}
}
