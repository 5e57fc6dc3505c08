package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// TestOpenAPIDescribesEveryAnswer records real answers of every route of a
// live API (real Redis, JetStream, and a worker on containerd where a route
// needs a run) and validates each against /openapi.json. Adding a field, a
// status or a route without documenting it fails here.
func TestOpenAPIDescribesEveryAnswer(t *testing.T) {
	e := setup(t)
	stopWorker := e.startWorker(t, "e2e-openapi", 1)
	ctx := context.Background()
	const key = "openapi-test-key"
	q := testQueue
	q.MaxMsgs = 10 // so a full queue (429) is reachable
	srv, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: q, APIKeys: map[string]string{key: "openapi"},
		MaxBodyBytes: 1 << 20, MaxBatch: 3, RuntimeCacheTTL: 50 * time.Millisecond, ToolCallQueueSlack: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := serveAPI(t, srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	r := newSpecRecorder(t, hs.URL, key)
	expect := func(want int) func(int, []byte) []byte {
		return func(got int, body []byte) []byte {
			t.Helper()
			if got != want {
				t.Fatalf("status %d, want %d: %s", got, want, body)
			}
			return body
		}
	}
	idOf := func(body []byte) string {
		var v struct{ ID string }
		_ = json.Unmarshal(body, &v)
		return v.ID
	}
	big := `{"code":"` + strings.Repeat("x", 1<<20) + `"}`
	unknownID := job.NewID()

	// Operations.
	expect(200)(r.call("GET", "/healthz", ""))
	expect(200)(r.call("GET", "/readyz", ""))
	expect(405)(r.call("PUT", "/v1/jobs", "{}"))
	expect(404)(r.call("GET", "/v2/jobs", ""))

	// Runtimes and tools.
	expect(200)(r.call("GET", "/v1/runtimes", ""))
	expect(401)(r.call("GET", "/v1/runtimes", "", "Authorization", ""))
	expect(200)(r.call("GET", "/v1/tools?format=anthropic", ""))
	expect(200)(r.call("GET", "/v1/tools?format=openai", ""))
	expect(200)(r.call("GET", "/v1/tools?format=openai-responses", ""))
	expect(400)(r.call("GET", "/v1/tools?format=gemini", ""))

	// Submissions: finished (run, then from the cache), accepted, refused.
	done := expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"print('spec')"}`))
	expect(200)(r.call("POST", "/v1/jobs", `{"code":"print('spec')"}`)) // cache hit
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"import sys; sys.exit(2)","cache":false,"metadata":{"team":"a","run":"r-1"}}`))
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"runtime":"python","code":"import os,sys; print(open('d/a.txt').read(), open('b.bin','rb').read(), os.environ['COLOR'], sys.argv[1:], input())",`+
		`"stdin":"in","args":["x"],"env":{"COLOR":"red"},"limits":{"timeout_ms":5000,"memory_mb":128},`+
		`"files":[{"name":"d/a.txt","content":"text","encoding":"utf8"},{"name":"b.bin","content":"AAE=","encoding":"base64"}]}`))
	slow := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"code":"import time; time.sleep(1.5); print(1)","cache":false}`)))
	expect(200)(r.call("GET", "/v1/jobs/"+slow, "")) // pending: an Accepted
	expect(200)(r.call("GET", "/v1/jobs/"+slow+"?wait=30s", ""))
	expect(400)(r.call("POST", "/v1/jobs", `{"code":`))
	expect(400)(r.call("POST", "/v1/jobs", `{"code":"1","memory":5}`))
	expect(400)(r.call("POST", "/v1/jobs?wait=soon", `{"code":"1"}`))
	expect(413)(r.call("POST", "/v1/jobs", big))
	expect(415)(r.call("POST", "/v1/jobs", `code=1`, "Content-Type", "text/plain"))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","runtime":"cobol"}`))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","env":{"PATH":"/x"}}`))
	expect(202)(r.call("POST", "/v1/jobs", `{"code":"print(3)","cache":false}`, "Idempotency-Key", "k-1"))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"print(4)","cache":false}`, "Idempotency-Key", "k-1"))
	expect(401)(r.call("POST", "/v1/jobs", `{"code":"1"}`, "Authorization", "Bearer wrong"))
	// Egress: a key without an allowance, and an entry that is not a host.
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","network":{"allow":["api.example.org"]}}`))
	expect(422)(r.call("POST", "/v1/jobs", `{"code":"1","network":{"allow":["10.0.0.1"]}}`))

	// Reading several jobs, and listing them.
	expect(200)(r.call("GET", "/v1/jobs?ids="+idOf(done)+","+slow+","+unknownID, ""))
	expect(200)(r.call("GET", "/v1/jobs", ""))
	page := expect(200)(r.call("GET", "/v1/jobs?limit=2", ""))
	var pg job.JobPage
	_ = json.Unmarshal(page, &pg)
	if len(pg.Jobs) != 2 || pg.NextCursor == "" {
		t.Errorf("a page of 2: %s", page)
	}
	expect(200)(r.call("GET", "/v1/jobs?limit=2&cursor="+pg.NextCursor, ""))
	failedPage := expect(200)(r.call("GET", "/v1/jobs?status=failed&tag=team%3Da&created_after=2020-01-01T00:00:00Z", ""))
	if !bytes.Contains(failedPage, []byte(`"run":"r-1"`)) {
		t.Errorf("the failed job with metadata is not listed: %s", failedPage)
	}
	expect(400)(r.call("GET", "/v1/jobs?ids=", ""))
	expect(400)(r.call("GET", "/v1/jobs?status=done", ""))
	expect(400)(r.call("GET", "/v1/jobs?tag=team", ""))
	expect(400)(r.call("GET", "/v1/jobs?ids=nope", ""))
	expect(400)(r.call("GET", "/v1/jobs?ids="+strings.Repeat(unknownID+",", 3)+unknownID, ""))

	// Batches.
	expect(200)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print('b')"},{"code":"print('c')","cache":false}]}`))
	expect(200)(r.callMixed("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print('b')"},{"code":""},{"code":"print(5)","limits":{"timeout_ms":-1}}]}`))
	expect(400)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"1"}]}`, "Idempotency-Key", "x"))
	expect(400)(r.call("POST", "/v1/jobs/batch", `{"jobs":[`))
	expect(413)(r.call("POST", "/v1/jobs/batch", `{"jobs":[`+big+`]}`))
	expect(415)(r.call("POST", "/v1/jobs/batch", `{}`, "Content-Type", "text/csv"))
	expect(422)(r.call("POST", "/v1/jobs/batch", `{"jobs":[]}`))
	expect(422)(r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"1"},{"code":"2"},{"code":"3"},{"code":"4"}]}`))

	// Budgets, replay and the audit log (issue 26).
	bud := idOf(expect(201)(r.call("POST", "/v1/budgets", `{"max_runs":1,"expires_s":600}`)))
	expect(200)(r.call("GET", "/v1/budgets/"+bud, ""))
	expect(400)(r.call("GET", "/v1/budgets/nope", ""))
	expect(404)(r.call("GET", "/v1/budgets/bud_"+strings.Repeat("0", 32), ""))
	expect(422)(r.call("POST", "/v1/budgets", `{}`))
	expect(415)(r.call("POST", "/v1/budgets", `max_runs=1`, "Content-Type", "application/x-www-form-urlencoded"))
	expect(400)(r.call("POST", "/v1/budgets", `{"max_runs":1,"max_run":1}`))
	expect(200)(r.call("POST", "/v1/jobs?wait=30s", `{"code":"print('budgeted')","cache":false,"budget":"`+bud+`"}`))
	expect(409)(r.call("POST", "/v1/jobs", `{"code":"print('over')","cache":false,"budget":"`+bud+`"}`))
	expect(202)(r.call("POST", "/v1/jobs/"+idOf(done)+"/replay", ""))
	expect(400)(r.call("POST", "/v1/jobs/not-an-id/replay", ""))
	expect(404)(r.call("POST", "/v1/jobs/"+unknownID+"/replay", ""))
	expect(200)(r.call("GET", "/v1/audit?kind=submission&limit=5", ""))
	expect(200)(r.call("GET", "/v1/audit?kind=egress", ""))
	expect(400)(r.call("GET", "/v1/audit?kind=nope", ""))

	// Sessions (issue 24): every operation, and its refusals.
	sess := idOf(expect(201)(r.call("POST", "/v1/sessions", `{"runtime":"python","metadata":{"agent":"a-1"}}`)))
	expect(422)(r.call("POST", "/v1/sessions", `{"runtime":"python","idle_timeout_s":-1}`))
	expect(415)(r.call("POST", "/v1/sessions", `{"runtime":"python"}`, "Content-Type", "application/x-www-form-urlencoded"))
	expect(200)(r.call("GET", "/v1/sessions", ""))
	if b := expect(200)(r.call("GET", "/v1/sessions?tag=agent%3Da-1", "")); !bytes.Contains(b, []byte(sess)) {
		t.Errorf("the session is not listed by its tag: %s", b)
	}
	if b := expect(200)(r.call("GET", "/v1/sessions?tag=agent%3Dother", "")); bytes.Contains(b, []byte(sess)) {
		t.Errorf("the session is listed by a tag it does not have: %s", b)
	}
	expect(400)(r.call("GET", "/v1/sessions?tag=agent", ""))
	expect(200)(r.call("GET", "/v1/sessions/"+sess, ""))
	expect(404)(r.call("GET", "/v1/sessions/"+unknownID, ""))
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/exec?wait=60s", `{"code":"open('n.txt', 'w').write('hi')"}`))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/calls/1", ""))
	expect(415)(r.call("POST", "/v1/sessions/"+sess+"/exec", `{"code":"1"}`, "Content-Type", "text/plain"))
	// A call not ended within its wait: its own pending body, twice.
	pend := expect(202)(r.call("POST", "/v1/sessions/"+sess+"/exec", `{"code":"import time; time.sleep(2)"}`))
	var pc job.CallPending
	if err := json.Unmarshal(pend, &pc); err != nil || !pc.Pending || pc.Seq != 2 || (pc.Status != job.CallQueued && pc.Status != job.CallRunning) {
		t.Errorf("a pending call: %s (%v)", pend, err)
	}
	expect(202)(r.call("GET", "/v1/sessions/"+sess+"/calls/2", ""))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/calls/2?wait=30s", ""))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/calls/1/events", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/calls/99", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/calls/99/events", ""))
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/calls/1/cancel", "")) // ended: left as it is
	expect(404)(r.call("POST", "/v1/sessions/"+sess+"/calls/99/cancel", ""))
	expect(201)(r.call("PUT", "/v1/sessions/"+sess+"/files/in.txt", "data", "Content-Type", "application/octet-stream"))
	// Shell commands: a foreground one's result, a background one's, its
	// wait and kill, an unknown id, an empty command, a pending one.
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/commands?wait=30s", `{"cmd":"ls -la; exit 2"}`))
	bg := expect(200)(r.call("POST", "/v1/sessions/"+sess+"/commands?wait=30s", `{"cmd":"exec sleep 60","background":true}`))
	var bgr job.CallResult
	if err := json.Unmarshal(bg, &bgr); err != nil || bgr.Command == nil || !bgr.Command.Running {
		t.Errorf("a background command: %s (%v)", bg, err)
	} else {
		expect(200)(r.call("GET", "/v1/sessions/"+sess+"/commands/"+bgr.Command.ID+"?wait=100ms", ""))
		expect(200)(r.call("POST", "/v1/sessions/"+sess+"/commands/"+bgr.Command.ID+"/kill", ""))
		expect(409)(r.call("POST", "/v1/sessions/"+sess+"/commands/"+bgr.Command.ID+"/stdin?wait=30s", `{"data":"x"}`))
	}
	// One with a stdin: written to and closed; the list; the refusals.
	cat := expect(200)(r.call("POST", "/v1/sessions/"+sess+"/commands?wait=30s", `{"cmd":"cat","background":true,"stdin":true}`))
	var catr job.CallResult
	if err := json.Unmarshal(cat, &catr); err != nil || catr.Command == nil || !catr.Command.Stdin {
		t.Errorf("a background command with a stdin: %s (%v)", cat, err)
	} else {
		expect(200)(r.call("POST", "/v1/sessions/"+sess+"/commands/"+catr.Command.ID+"/stdin?wait=30s", `{"data":"x\n","close":true}`))
		expect(422)(r.call("POST", "/v1/sessions/"+sess+"/commands/"+catr.Command.ID+"/stdin?wait=30s", `{}`))
	}
	expect(404)(r.call("POST", "/v1/sessions/"+sess+"/commands/999/stdin?wait=30s", `{"data":"x"}`))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/commands?wait=30s", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/commands/999", ""))
	expect(422)(r.call("POST", "/v1/sessions/"+sess+"/commands", `{"cmd":""}`))
	expect(202)(r.call("POST", "/v1/sessions/"+sess+"/commands", `{"cmd":"sleep 2"}`))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/files/n.txt", ""))
	expect(404)(r.call("GET", "/v1/sessions/"+sess+"/files/nope.txt", ""))
	expect(200)(r.call("GET", "/ui/sessions/"+sess, ""))
	expect(404)(r.call("GET", "/ui/sessions/"+unknownID, ""))
	expect(401)(r.call("GET", "/ui/sessions/"+sess, "", "Authorization", ""))
	// The file operations, then a pause and a resume.
	expect(201)(r.call("POST", "/v1/sessions/"+sess+"/files?wait=30s", `{"op":"mkdir","path":"d/e"}`))
	expect(200)(r.call("GET", "/v1/sessions/"+sess+"/files?path=d", ""))
	expect(200)(r.call("HEAD", "/v1/sessions/"+sess+"/files/in.txt", ""))
	expect(204)(r.call("DELETE", "/v1/sessions/"+sess+"/files/d?recursive=true&wait=30s", ""))
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/pause?wait=60s", ""))
	expect(200)(r.call("POST", "/v1/sessions/"+sess+"/resume", ""))
	expect(404)(r.call("POST", "/v1/sessions/"+unknownID+"/pause", ""))
	expect(404)(r.call("POST", "/v1/sessions/"+unknownID+"/resume", ""))
	expect(200)(r.call("DELETE", "/v1/sessions/"+sess, ""))
	expect(410)(r.call("POST", "/v1/sessions/"+sess+"/exec", `{"code":"1"}`))
	expect(410)(r.call("POST", "/v1/sessions/"+sess+"/pause", ""))
	expect(410)(r.call("POST", "/v1/sessions/"+sess+"/resume", ""))

	// One job.
	expect(400)(r.call("GET", "/v1/jobs/not-an-id", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID, ""))
	expect(400)(r.call("GET", "/v1/jobs/"+slow+"?wait=-1s", ""))

	// Live events of a job that prints and leaves files, then its artifacts.
	artJob := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"cache":false,"code":"import os,sys,time\ntime.sleep(1)\nprint('live')\nprint('warn', file=sys.stderr)\n`+
		`out = os.environ['KILN_OUTPUT_DIR']\nopen(out + '/notes.txt', 'w').write('n' * 2000)\nopen(out + '/blob.bin', 'wb').write(bytes(range(256)))"}`)))
	expect(200)(r.call("GET", "/v1/jobs/"+artJob+"/events", "")) // followed live until its result
	types := map[string]bool{}
	for _, ev := range r.events {
		types[ev.typ] = true
	}
	for _, want := range []string{job.EventStatus, job.EventStdout, job.EventStderr, job.EventArtifacts, job.EventResult} {
		if !types[want] {
			t.Errorf("the live event stream has no %q event: %+v", want, r.events)
		}
	}
	if last := r.events[len(r.events)-1]; last.typ != job.EventResult {
		t.Errorf("the event stream ends with %q, not the result", last.typ)
	}
	expect(200)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Last-Event-ID", r.events[0].id)) // finished: the result at once
	if len(r.events) != 1 || r.events[0].typ != job.EventResult {
		t.Errorf("a finished job's stream: %+v; want its result only", r.events)
	}
	expect(400)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Last-Event-ID", "yesterday"))
	expect(400)(r.call("GET", "/v1/jobs/not-an-id/events", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID+"/events", ""))
	expect(401)(r.call("GET", "/v1/jobs/"+artJob+"/events", "", "Authorization", ""))

	var artRes struct{ Artifacts []job.Artifact }
	_ = json.Unmarshal(expect(200)(r.call("GET", "/v1/jobs/"+artJob, "")), &artRes)
	etag := map[string]string{}
	for _, a := range artRes.Artifacts {
		etag[a.Name] = `"` + a.SHA256 + `"`
	}
	if len(etag) != 2 || etag["notes.txt"] == "" || etag["blob.bin"] == "" {
		t.Fatalf("artifacts %+v; want notes.txt and blob.bin", artRes.Artifacts)
	}
	art := "/v1/jobs/" + artJob + "/artifacts/"
	expect(200)(r.call("GET", art+"notes.txt", ""))
	if b := expect(200)(r.call("GET", art+"blob.bin", "")); len(b) != 256 {
		t.Errorf("blob.bin: %d bytes", len(b))
	}
	if b := expect(206)(r.call("GET", art+"blob.bin", "", "Range", "bytes=10-19")); !bytes.Equal(b, []byte{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}) {
		t.Errorf("bytes=10-19 of blob.bin: %v", b)
	}
	expect(304)(r.call("GET", art+"notes.txt", "", "If-None-Match", etag["notes.txt"]))
	expect(412)(r.call("GET", art+"notes.txt", "", "If-Match", etag["blob.bin"]))
	expect(416)(r.call("GET", art+"blob.bin", "", "Range", "bytes=256-"))
	expect(404)(r.call("GET", art+"nope.txt", ""))
	expect(404)(r.call("GET", "/v1/jobs/"+unknownID+"/artifacts/notes.txt", ""))

	// The run page, its login and its assets.
	if page := expect(200)(r.call("GET", "/ui/jobs/"+artJob, "")); !bytes.Contains(page, []byte("notes.txt")) {
		t.Errorf("the run page does not list the artifacts")
	}
	expect(404)(r.call("GET", "/ui/jobs/"+unknownID, ""))
	expect(401)(r.call("GET", "/ui/jobs/"+artJob, "", "Authorization", ""))
	expect(200)(r.call("GET", "/ui/login?next=/ui/jobs/"+artJob, "", "Authorization", ""))
	const form = "application/x-www-form-urlencoded"
	expect(303)(r.call("POST", "/ui/login", "key="+key+"&next=/ui/jobs/"+artJob, "Content-Type", form, "Authorization", ""))
	expect(401)(r.call("POST", "/ui/login", "key=wrong", "Content-Type", form, "Authorization", ""))
	expect(400)(r.send(false, "POST", "/ui/login", "key=%zz", "Content-Type", form, "Authorization", ""))
	expect(200)(r.call("GET", "/ui/assets/run.js", "", "Authorization", ""))
	expect(200)(r.call("GET", "/ui/assets/kiln.css", "", "Authorization", ""))
	expect(404)(r.call("GET", "/ui/assets/nope.js", "", "Authorization", ""))
	expect(400)(r.call("GET", "/v1/jobs/not-an-id/artifacts/notes.txt", ""))
	expect(401)(r.call("GET", art+"notes.txt", "", "Authorization", ""))

	// Cancel: a running job (202, then canceled), a finished one (200).
	running := idOf(expect(202)(r.call("POST", "/v1/jobs", `{"code":"import time; time.sleep(20)","cache":false}`)))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status == job.StatusRunning })
	expect(202)(r.call("DELETE", "/v1/jobs/"+running, ""))
	e.waitRecord(t, running, 20*time.Second, func(rec cache.Record) bool { return rec.Status.Terminal() })
	expect(200)(r.call("DELETE", "/v1/jobs/"+running, ""))
	expect(400)(r.call("DELETE", "/v1/jobs/x", ""))
	expect(404)(r.call("DELETE", "/v1/jobs/"+unknownID, ""))

	// Tool calls in the three formats (a figure's image in each answer that
	// carries images), and envelopes that are not tool calls.
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_1","name":"run_python","input":{"code":"print(7)"}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"id":"call_1","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"print(1\"}"}}`))
	const figure = `import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n`
	figureArgs, _ := json.Marshal(fmt.Sprintf(`{"code":%q,"timeout_s":60}`, figure))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"function_call","id":"fc_1","call_id":"call_2","name":"run_python","arguments":`+string(figureArgs)+`}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_6","name":"run_python","input":{"code":`+strconv.Quote(figure)+`,"timeout_s":60}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"id":"call_3","type":"function","function":{"name":"run_python","arguments":`+string(figureArgs)+`}}`))
	expect(200)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_2","name":"run_java","input":{"code":"x"}}`))
	expect(200)(r.callMixed("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_5","name":"run_python","input":{"source":"x"}}`))
	expect(400)(r.call("POST", "/v1/tool-calls", `{"type":`))
	expect(413)(r.call("POST", "/v1/tool-calls", big))
	expect(415)(r.call("POST", "/v1/tool-calls", `{}`, "Content-Type", "text/plain"))
	expect(422)(r.call("POST", "/v1/tool-calls", `{"type":"text","text":"hi"}`))

	// A full queue: with no worker, MaxMsgs (10) queued jobs are the limit.
	stopWorker()
	var full bool
	for i := 0; i < 12 && !full; i++ {
		st, _ := r.call("POST", "/v1/jobs", fmt.Sprintf(`{"code":"print(%d)","cache":false}`, 100+i))
		full = st == http.StatusTooManyRequests
	}
	if !full {
		t.Fatal("no 429 with the queue full")
	}
	expect(429)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_3","name":"run_python","input":{"code":"print(8)"}}`))

	// Redis gone: the job store is unavailable.
	e.redis.Stop()
	// Once the runtime registry's cached copy (RuntimeCacheTTL) is stale.
	testkit.Eventually(t, 10*time.Second, "GET /v1/runtimes to answer 503", func() bool {
		st, _ := r.call("GET", "/v1/runtimes", "")
		return st == http.StatusServiceUnavailable
	})
	expect(503)(r.call("GET", "/readyz", ""))
	expect(503)(r.call("GET", "/v1/jobs/"+slow, ""))
	expect(503)(r.call("GET", "/v1/jobs?ids="+slow, ""))
	expect(503)(r.call("GET", art+"notes.txt", ""))
	expect(503)(r.call("GET", "/v1/jobs/"+artJob+"/events", ""))
	expect(503)(r.call("DELETE", "/v1/jobs/"+slow, ""))
	expect(503)(r.call("POST", "/v1/jobs", `{"code":"print(9)"}`))
	expect(503)(r.call("GET", "/v1/runtimes", ""))
	expect(503)(r.call("GET", "/v1/tools?format=openai", ""))
	expect(503)(r.call("POST", "/v1/tool-calls", `{"type":"tool_use","id":"toolu_4","name":"run_python","input":{"code":"print(9)"}}`))
	st, body := r.call("POST", "/v1/jobs/batch", `{"jobs":[{"code":"print(10)"}]}`)
	if st != 200 || !bytes.Contains(body, []byte(`"status":503`)) {
		t.Errorf("batch with Redis down: %d %s", st, body)
	}

	// Every operation of the document was exercised.
	var missing, report []string
	for path, item := range r.doc.Paths.Map() {
		for method := range item.Operations() {
			k := method + " " + path
			if len(r.seen[k]) == 0 {
				missing = append(missing, k)
			}
		}
	}
	for k, sts := range r.seen {
		var codes []int
		for c := range sts {
			codes = append(codes, c)
		}
		sort.Ints(codes)
		report = append(report, fmt.Sprintf("%s %v", k, codes))
	}
	sort.Strings(report)
	t.Logf("answers validated:\n%s", strings.Join(report, "\n"))
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("operations of /openapi.json this test never called: %v", missing)
	}
}
