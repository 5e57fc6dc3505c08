package producer

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

func TestBadInputIsAnsweredWithAProblemSayingWhatToFix(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxBodyBytes = 4096 })
	big := `{"code":"` + strings.Repeat("x", 5000) + `"}`
	cases := []struct {
		name    string
		method  string
		path    string
		body    string
		hdr     []string
		status  int
		typ     string
		field   string
		contain []string
	}{
		{"malformed JSON", "POST", "/v1/jobs", `{"code": "print(1)",}`, nil, 400, string(job.ProblemMalformedJSON), "", []string{"byte offset 21"}},
		{"truncated JSON", "POST", "/v1/jobs", `{"code": "print(1)"`, nil, 400, string(job.ProblemMalformedJSON), "", []string{"ends early"}},
		{"trailing data", "POST", "/v1/jobs", `{"code": "print(1)"} {}`, nil, 400, string(job.ProblemMalformedJSON), "", []string{"after the JSON object"}},
		{"empty body", "POST", "/v1/jobs", ` `, nil, 400, string(job.ProblemMalformedJSON), "", []string{"empty"}},
		{"wrong type", "POST", "/v1/jobs", `{"code": 5}`, nil, 400, string(job.ProblemMalformedJSON), "code", []string{"string"}},
		{"wrong content type", "POST", "/v1/jobs", `{"code":"print(1)"}`, []string{"Content-Type", "text/plain"}, 415, string(job.ProblemUnsupportedMediaType), "", []string{"application/json"}},
		{"unknown field", "POST", "/v1/jobs", `{"code":"print(1)","limits":{"memory":512}}`, nil, 400, string(job.ProblemUnknownField), "limits.memory", []string{`unknown field "limits.memory"`, "memory_mb"}},
		{"unknown top-level field", "POST", "/v1/jobs", `{"code":"print(1)","timeout":5}`, nil, 400, string(job.ProblemUnknownField), "timeout", []string{`unknown field "timeout"`, "the body's fields: args, budget, cache, callback_url, code, env, files, limits, metadata, network, runtime, stdin"}},
		{"missing code", "POST", "/v1/jobs", `{"runtime":"python"}`, nil, 422, string(job.ProblemInvalidField), "code", []string{"code is empty"}},
		{"unknown runtime", "POST", "/v1/jobs", `{"code":"1","runtime":"cobol"}`, nil, 422, string(job.ProblemInvalidField), "runtime", []string{`"cobol"`, "python"}},
		{"limit above max", "POST", "/v1/jobs", `{"code":"1","limits":{"memory_mb":99999}}`, nil, 422, string(job.ProblemInvalidField), "limits.memory_mb", []string{"maximum is 4096"}},
		{"negative limit", "POST", "/v1/jobs", `{"code":"1","limits":{"timeout_ms":-1}}`, nil, 422, string(job.ProblemInvalidField), "limits.timeout_ms", []string{"positive"}},
		{"memory below the runtime's minimum", "POST", "/v1/jobs", `{"code":"1","limits":{"memory_mb":1}}`, nil, 422, string(job.ProblemInvalidField), "limits.memory_mb", []string{"minimum is 16"}},
		{"colliding file names", "POST", "/v1/jobs", `{"code":"1","files":[{"name":"a/b","content":"x"},{"name":"a","content":"y"}]}`, nil, 422, string(job.ProblemInvalidField), "files[0].name", []string{`"a" to be a directory`}},
		{"reserved env", "POST", "/v1/jobs", `{"code":"1","env":{"PATH":"/x"}}`, nil, 422, string(job.ProblemInvalidField), "env", []string{"reserved"}},
		{"body too large", "POST", "/v1/jobs", big, nil, 413, string(job.ProblemBodyTooLarge), "", []string{"maximum of 4096 bytes"}},
		{"bad wait", "POST", "/v1/jobs?wait=soon", `{"code":"1"}`, nil, 400, string(job.ProblemInvalidParameter), "wait", []string{"wait=30s"}},
		{"unknown id", "GET", "/v1/jobs/" + job.NewID(), "", nil, 404, string(job.ProblemNotFound), "", []string{"no job"}},
		{"bad id", "GET", "/v1/jobs/not-an-id", "", nil, 400, string(job.ProblemInvalidID), "id", []string{"not a job id"}},
		{"upper-case id", "GET", "/v1/jobs/" + strings.ToUpper(job.NewID()), "", nil, 400, string(job.ProblemInvalidID), "id", nil},
		{"path characters in id", "GET", "/v1/jobs/..%2F..%2Fetc", "", nil, 400, string(job.ProblemInvalidID), "id", nil},
		{"cancel unknown id", "DELETE", "/v1/jobs/" + job.NewID(), "", nil, 404, string(job.ProblemNotFound), "", nil},
		{"cancel bad id", "DELETE", "/v1/jobs/x", "", nil, 400, string(job.ProblemInvalidID), "id", nil},
		{"list with empty ids", "GET", "/v1/jobs?ids=", "", nil, 400, string(job.ProblemInvalidParameter), "ids", nil},
		{"ids with a filter", "GET", "/v1/jobs?ids=" + job.NewID() + "&status=failed", "", nil, 400, string(job.ProblemInvalidParameter), "status", []string{"without ids="}},
		{"listing by a bad status", "GET", "/v1/jobs?status=done", "", nil, 400, string(job.ProblemInvalidParameter), "status", []string{"succeeded"}},
		{"listing by a bad time", "GET", "/v1/jobs?created_after=yesterday", "", nil, 400, string(job.ProblemInvalidParameter), "created_after", []string{"RFC 3339"}},
		{"listing by a bad tag", "GET", "/v1/jobs?tag=team", "", nil, 400, string(job.ProblemInvalidParameter), "tag", []string{"KEY=VALUE"}},
		{"listing a page too large", "GET", "/v1/jobs?limit=101", "", nil, 400, string(job.ProblemInvalidParameter), "limit", []string{"1 .. 100"}},
		{"listing with a misspelt filter", "GET", "/v1/jobs?statuss=failed", "", nil, 400, string(job.ProblemInvalidParameter), "statuss", []string{"status"}},
		{"listing with a bad cursor", "GET", "/v1/jobs?cursor=abc", "", nil, 400, string(job.ProblemInvalidParameter), "cursor", nil},
		{"list bad id", "GET", "/v1/jobs?ids=" + job.NewID() + ",nope", "", nil, 400, string(job.ProblemInvalidID), "ids[1]", nil},
		{"list too many", "GET", "/v1/jobs?ids=" + strings.Repeat(job.NewID()+",", 100) + job.NewID(), "", nil, 400, string(job.ProblemBatchTooLarge), "ids", []string{"maximum is 100"}},
		{"no such endpoint", "GET", "/v2/nothing", "", nil, 404, string(job.ProblemNotFound), "", []string{"openapi.json"}},
		{"wrong method", "PUT", "/v1/jobs", `{}`, nil, 405, string(job.ProblemMethodNotAllowed), "", []string{"POST"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, tc.method, tc.path, tc.body, tc.hdr...)
			p := r.problem(t, tc.status)
			if p.Type != tc.typ || p.Field != tc.field {
				t.Fatalf("type %q field %q, want %q %q; %s", p.Type, p.Field, tc.typ, tc.field, r.body)
			}
			for _, c := range tc.contain {
				if !strings.Contains(p.Detail, c) {
					t.Errorf("detail %q lacks %q", p.Detail, c)
				}
			}
		})
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"s3cret-key": "team-a"} })
	for _, auth := range []string{"", "Bearer wrong", "Basic czNjcmV0LWtleQ==", "Bearer "} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"code":"print(1)"}`, "Authorization", auth)
		r.problem(t, http.StatusUnauthorized)
		if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("auth %q: WWW-Authenticate %q", auth, r.Header.Get("WWW-Authenticate"))
		}
		if got := b.streamMsgs(t); got != 0 {
			t.Fatalf("auth %q: unauthenticated request published", auth)
		}
	}
	b.do(t, http.MethodGet, "/v1/runtimes", "", "Authorization", "").problem(t, http.StatusUnauthorized)
	accepted(t, b.submit(t, `{"code":"print(1)"}`))
	for _, open := range []string{"/healthz", "/readyz", "/openapi.json"} {
		if r := b.do(t, http.MethodGet, open, "", "Authorization", ""); r.StatusCode != 200 {
			t.Errorf("%s without key: %d", open, r.StatusCode)
		}
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := accepted(t, b.submit(t, `{"code":"print(1)"}`))
	waiter := make(chan response, 1)
	go func() { waiter <- b.do(t, http.MethodGet, "/v1/jobs/"+v.ID+"?wait=30s", "") }()
	b.awaitLongPoll(t, v.ID)

	r := b.do(t, http.MethodDelete, "/v1/jobs/"+v.ID, "")
	var res job.Result
	r.decode(t, &res)
	if r.StatusCode != 200 || res.Status != job.StatusCanceled || res.Error == nil || res.Error.Category != job.CategoryCanceled {
		t.Fatalf("cancel queued: %d %s", r.StatusCode, r.body)
	}
	select {
	case w := <-waiter:
		if !strings.Contains(string(w.body), `"canceled"`) {
			t.Fatalf("waiter got %s", w.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long-poll on a canceled job was not woken")
	}
	// The identical job can be submitted again: cancel released the claim.
	if again := accepted(t, b.submit(t, `{"code":"print(1)"}`)); again.ID == v.ID {
		t.Fatal("resubmission coalesced with the canceled job")
	}

	// A running job is asked to stop through kiln.cancel.
	run := accepted(t, b.submit(t, `{"code":"print(2)"}`))
	if _, err := b.store.MarkRunningLeased(context.Background(), run.ID, "w1", 1, time.Now(), cache.Lease{Token: "w1/1"}); err != nil {
		t.Fatal(err)
	}
	sub, err := b.nc.SubscribeSync(job.CancelSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+run.ID, "")
	var pv pendingView
	r.decode(t, &pv)
	if r.StatusCode != http.StatusAccepted || pv.Status != job.StatusRunning || !pv.CancelRequested {
		t.Fatalf("cancel running: %d %s", r.StatusCode, r.body)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != run.ID {
		t.Fatalf("cancel request on %s: %v %v", job.CancelSubject, err, m)
	}
}

func TestListJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := accepted(t, b.submit(t, `{"code":"print(1)"}`))
	missing := job.NewID()
	r := b.do(t, http.MethodGet, "/v1/jobs?ids="+v.ID+","+missing, "")
	var out struct {
		Jobs []struct {
			ID     string       `json:"id"`
			Status job.Status   `json:"status"`
			Error  *problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &out)
	if r.StatusCode != 200 || len(out.Jobs) != 2 || out.Jobs[0].ID != v.ID || out.Jobs[0].Status != job.StatusQueued ||
		out.Jobs[1].ID != missing || out.Jobs[1].Error == nil || out.Jobs[1].Error.Status != 404 {
		t.Fatalf("%d %s", r.StatusCode, r.body)
	}
}

func TestRuntimesHealthAndOpenAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, http.MethodGet, "/v1/runtimes", "")
	var rt struct{ Runtimes []job.RuntimeInfo }
	r.decode(t, &rt)
	if len(rt.Runtimes) != 1 || rt.Runtimes[0].Name != "python" || rt.Runtimes[0].Digest != testDigest || rt.Runtimes[0].Limits.Max.MemoryMB != 4096 {
		t.Fatalf("runtimes: %s", r.body)
	}
	if r := b.do(t, http.MethodGet, "/healthz", ""); r.StatusCode != 200 {
		t.Fatalf("healthz %d", r.StatusCode)
	}
	if r := b.do(t, http.MethodGet, "/readyz", ""); r.StatusCode != 200 {
		t.Fatalf("readyz %d %s", r.StatusCode, r.body)
	}
	r = b.do(t, http.MethodGet, "/openapi.json", "")
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
		Comps   struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	for path, methods := range map[string][]string{
		"/v1/jobs": {"post", "get"}, "/v1/jobs/{id}": {"get", "delete"}, "/v1/jobs/batch": {"post"},
		"/v1/runtimes": {"get"}, "/healthz": {"get"}, "/readyz": {"get"}, "/openapi.json": {"get"},
	} {
		for _, m := range methods {
			if doc.Paths[path][m] == nil {
				t.Errorf("openapi.json lacks %s %s", m, path)
			}
		}
	}
	for _, s := range []string{"Spec", "Limits", "Result", "Problem", "Accepted", "RuntimeInfo"} {
		if doc.Comps.Schemas[s] == nil {
			t.Errorf("openapi.json lacks schema %s", s)
		}
	}
}

func TestStopLongPollsAnswersOpenWaitsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := accepted(t, b.submit(t, `{"code":"print(1)"}`))
	got := make(chan response, 1)
	go func() { got <- b.do(t, http.MethodGet, "/v1/jobs/"+v.ID+"?wait=30s", "") }()
	b.awaitLongPoll(t, v.ID)
	b.srv.StopLongPolls()
	select {
	case r := <-got:
		if r.StatusCode != 200 || !strings.Contains(string(r.body), `"queued"`) {
			t.Fatalf("%d %s", r.StatusCode, r.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long-poll still open after StopLongPolls")
	}
}
