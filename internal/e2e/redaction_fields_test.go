package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/egresstest"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/redact"
	"github.com/kilnrun/kiln/worker"
	"github.com/kilnrun/kiln/worker/egress"
)

// everyFieldJob puts a built-in key (AWS), the tenant's registered secret
// and a match of its pattern (EMP + six digits) in every string of the
// result a program reaches: stdout, stderr, each display output's MIME
// types (text/plain, text/html, text/markdown, application/json values and
// keys, a MIME type itself), an artifact's name, an egress record's host,
// and the exception's type, message, source line and frames (its function
// and file). The code builds each from parts: no whole one is in it.
const everyFieldJob = `import importlib, os, sys, urllib.request
AWS = "AKIA" + "QWERTYUIOPASDFGH"
SECRET = "tenant-vault-" + "passphrase-42"
EMP = "EMP" + "778899"
print("stdout:", AWS, SECRET, EMP, flush=True)
print("stderr:", AWS, SECRET, EMP, file=sys.stderr, flush=True)

class Shown:
    def __repr__(self):
        return "plain " + AWS + " " + SECRET
    def _repr_html_(self):
        return "<b>" + AWS + "</b> " + SECRET
    def _repr_markdown_(self):
        return "**" + SECRET + "** " + EMP
    def _repr_json_(self):
        return {SECRET: [AWS, {"deep": EMP}], "plain": "ok"}

class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "bundle", "application/x-" + EMP: "v " + AWS}

display(Shown())
display(Bundle())
open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "dump-" + SECRET + ".txt"), "w").write("x")
try:
    urllib.request.urlopen("http://" + SECRET + ".test/hello", timeout=20)
except Exception as e:
    print("refused as it should be:", type(e).__name__)
with open("/work/gen_" + EMP + ".py", "w") as f:
    f.write("class E%sError(Exception):\n    pass\n\n" % EMP)
    f.write("def fail_%s(k):\n    raise E%sError('key ' + k + ' refused')  # %s\n" % (EMP, EMP, AWS))
sys.path.insert(0, "/work")
mod = importlib.import_module("gen_" + EMP)
getattr(mod, "fail_" + EMP)(AWS + " " + SECRET)
`

// Issue 40, acceptance 1: a key, the tenant's registered secret and its
// pattern, planted in every string field a job can reach (see
// everyFieldJob; a syntax error's source line beside it), come back
// redacted in the result, in every SSE event and in a cache hit (and the
// egress host in the audit log); the result's redactions count them. redact.TestResultRedactsEveryStringField
// fails when a new result field is not covered.
func TestRedactionReachesEveryField(t *testing.T) {
	e := setup(t)
	const apiKey, tenant = "fields-key", "fields"
	secret := "tenant-vault-passphrase-42"
	fp, err := redact.Fingerprint(secret)
	if err != nil {
		t.Fatal(err)
	}
	srvEg := egresstest.New(t, "files.test")
	th, err := egress.ParseTestHosts(srvEg.Hosts("files.test", "plain.test"))
	if err != nil {
		t.Fatal(err)
	}
	allowance, err := egressrule.ParseRules("files.test")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, APIKeys: map[string]string{apiKey: tenant},
		Tenants: map[string]producer.Tenant{tenant: {Egress: allowance, Redact: &job.RedactPolicy{
			Secrets: []job.SecretPrint{fp}, Patterns: []job.RedactPattern{{Name: "employee", Regexp: `EMP[0-9]{6}`}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	e.startWorker(t, "w-fields", 1, func(c *telemetry) { c.worker = func(w *worker.Config) { w.EgressTestHosts = th } })
	api := &sessAPI{t: t, base: hs.URL}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	leaks := []string{"AKIAQWERTYUIOPASDFGH", secret, "EMP778899", `\u0041KIA`}
	check := func(where, text string) {
		t.Helper()
		if text == "" {
			t.Errorf("%s: empty", where)
		}
		for _, k := range leaks {
			if i := strings.Index(text, k); i >= 0 {
				t.Errorf("%s holds %s: ...%s...", where, k, text[max(0, i-80):min(len(text), i+len(k)+40)])
			}
		}
	}
	run := func(name string, spec map[string]any, wantCategory job.Category) (job.Result, string) {
		t.Helper()
		status, body := api.do(apiKey, "POST", "/v1/jobs", spec)
		var sub struct{ ID string }
		if status != http.StatusAccepted || json.Unmarshal(body, &sub) != nil {
			t.Fatalf("%s: submit %d %s", name, status, body)
		}
		var sse strings.Builder
		for _, ev := range collect(t, followEventsAs(t, ctx, hs.URL, sub.ID, apiKey), 90*time.Second) {
			fmt.Fprintf(&sse, "%s %s\n", ev.typ, ev.data)
		}
		rec := e.waitRecord(t, sub.ID, 90*time.Second, func(r cache.Record) bool { return r.Status.Terminal() })
		_, got := api.do(apiKey, "GET", "/v1/jobs/"+sub.ID, nil)
		var res job.Result
		if err := json.Unmarshal(got, &res); err != nil {
			t.Fatal(err)
		}
		if rec.Status != job.StatusFailed || res.Error == nil || res.Error.Category != wantCategory {
			t.Fatalf("%s: %s %+v\nstdout %s\nstderr %s", name, rec.Status, res.Error, res.Stdout, res.Stderr)
		}
		check(name+": GET", string(got))
		check(name+": SSE", sse.String())
		// The same spec again: a cache hit, answered from the stored result.
		status, hit := api.do(apiKey, "POST", "/v1/jobs?wait=30s", spec)
		var hr job.Result
		if status != http.StatusOK || json.Unmarshal(hit, &hr) != nil || !hr.CacheHit {
			t.Fatalf("%s: resubmission %d, not a cache hit: %.300s", name, status, hit)
		}
		check(name+": cache hit", string(hit))
		return res, string(got)
	}

	spec := map[string]any{"code": everyFieldJob, "runtime": "python", "cache": true,
		"network": map[string]any{"allow": []string{"files.test"}}}
	res, raw := run("every field", spec, job.CategoryRuntimeError)
	// Every field was there to redact: the redactions prove each was seen.
	exc := res.Error.Exception
	switch {
	case exc == nil || !strings.Contains(exc.Type, "[REDACTED:pattern:employee]") || !strings.Contains(exc.Message, "[REDACTED:") ||
		!strings.Contains(exc.SourceLine, "[REDACTED:") || len(exc.Frames) < 2:
		t.Errorf("the exception: %+v", exc)
	case !strings.Contains(exc.Frames[len(exc.Frames)-1].Function, "[REDACTED:pattern:employee]") ||
		!strings.Contains(exc.Frames[len(exc.Frames)-1].File, "[REDACTED:pattern:employee]"):
		t.Errorf("the exception's innermost frame: %+v", exc.Frames[len(exc.Frames)-1])
	}
	if len(res.Outputs) != 2 {
		t.Fatalf("outputs: %s", raw)
	}
	shown := res.Outputs[0]
	for _, mime := range []string{job.MIMEText, job.MIMEHTML, job.MIMEMarkdown, job.MIMEJSON} {
		if !strings.Contains(string(shown.Data[mime]), "[REDACTED:") {
			t.Errorf("output %s: %s", mime, shown.Data[mime])
		}
	}
	if _, ok := res.Outputs[1].Data["application/x-[REDACTED:pattern:employee]"]; !ok {
		t.Errorf("the bundle's MIME type: %v", res.Outputs[1].Data)
	}
	if len(res.Artifacts) != 1 || res.Artifacts[0].Name != "dump-"+redact.Replacement(redact.KindSecret)+".txt" {
		t.Errorf("artifacts: %+v", res.Artifacts)
	}
	if eg := res.Egress; eg == nil || len(eg.Records) != 1 || !strings.Contains(eg.Records[0].Host, redact.Replacement(redact.KindSecret)) {
		t.Errorf("egress: %+v", res.Egress)
	}
	for _, k := range []string{redact.KindAWSAccessKey, redact.KindSecret, "pattern:employee"} {
		if res.Redactions[k] == 0 {
			t.Errorf("redactions %v: none of %s", res.Redactions, k)
		}
	}

	// The job's egress records in the tenant's audit log: redacted too.
	status, audited := api.do(apiKey, "GET", "/v1/audit?kind=egress", nil)
	if status != http.StatusOK || !strings.Contains(string(audited), redact.Replacement(redact.KindSecret)) {
		t.Errorf("the audit log's egress records: %d %s", status, audited)
	}
	check("every field: audit log", string(audited))

	// A syntax error: its source line (the program's own, with the secret).
	syntax := map[string]any{"code": "x = 1\nprint('" + secret + "' EMP778899)\n", "runtime": "python"}
	res, _ = run("syntax error", syntax, job.CategorySyntaxError)
	if exc := res.Error.Exception; exc == nil || exc.Line != 2 || !strings.Contains(exc.SourceLine, redact.Replacement(redact.KindSecret)) {
		t.Errorf("the syntax error's exception: %+v", res.Error.Exception)
	}
}
