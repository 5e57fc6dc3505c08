package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// deepJSONJob writes a display output whose application/json value nests
// 10,000 levels deep straight onto its output channel (past what the
// launcher's json.dumps would encode, as a program that wants it can).
const deepJSONJob = `import builtins, os
fd = builtins.display.__self__.fd
deep = "[" * 10000 + "]" * 10000
os.write(fd, ('{"type":"display_data","data":{"text/plain":"deep","application/json":' + deep + '}}\n').encode())
print("wrote it")
`

// Issue 40, acceptance 3: a 10,000-deep JSON output makes a result every
// SDK decodes (Go's client, Python's and TypeScript's, each as shipped,
// against the live API), the output flagged "flattened" in the result and
// in its SSE output event, its value the JSON text.
func TestDeepJSONOutputDecodesInEverySDK(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-deepjson", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sub, err := e.api.Submit(ctx, py("%s", deepJSONJob))
	if err != nil {
		t.Fatal(err)
	}
	evs := followEvents(t, ctx, e.apiURL, sub.ID, "")
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatalf("the Go client: %v", err)
	}
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	if v.Status != job.StatusSucceeded || len(v.Outputs) != 1 {
		t.Fatalf("job %s: %s %+v outputs %d\n%s", sub.ID, v.Status, v.Error, len(v.Outputs), v.Stderr)
	}
	if o := v.Outputs[0]; !slices.Equal(o.Flattened, []string{job.MIMEJSON}) || o.Text(job.MIMEJSON) != deep || o.Text(job.MIMEText) != "deep" {
		t.Fatalf("the output: flattened %v, application/json %.40s", o.Flattened, o.Data[job.MIMEJSON])
	}
	var flagged bool
	for _, ev := range collect(t, evs, time.Minute) {
		if ev.typ == job.EventOutput {
			var d job.DisplayEvent
			if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
				t.Fatalf("the output event does not decode: %v", err)
			}
			flagged = slices.Equal(d.Flattened, []string{job.MIMEJSON})
		}
	}
	if !flagged {
		t.Error("the SSE output event is not flagged flattened")
	}

	root := repoRoot(t)
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = root
		cmd.Env = append(cmd.Environ(), "PYTHONPATH=sdk/python", "KILN_SERVER="+e.apiURL, "JOB_ID="+sub.ID)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	pyOut := run(debianPython(t), "-c", `import os, kiln
r = kiln.Client(os.environ["KILN_SERVER"], "any").get(os.environ["JOB_ID"])
o = r.outputs[0]
print(r.status, o["flattened"], len(o["data"]["application/json"]))`)
	if pyOut != "succeeded ['application/json'] 20000" {
		t.Errorf("the Python SDK read: %q", pyOut)
	}
	tsOut := run(lookTool(t, "node"), "--input-type=module", "-e", `import { Client } from "./sdk/typescript/src/index.js";
const j = await new Client({ server: process.env.KILN_SERVER, apiKey: "any" }).get(process.env.JOB_ID);
const o = j.outputs[0];
console.log(j.status, JSON.stringify(o.flattened), o.data["application/json"].length);`)
	if tsOut != `succeeded ["application/json"] 20000` {
		t.Errorf("the TypeScript SDK read: %q", tsOut)
	}
}
