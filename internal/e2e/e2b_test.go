package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kilnrun/kiln/e2bapi"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	ktrace "github.com/kilnrun/kiln/trace"
)

// Issue 38: code written for E2B's SDKs runs on Kiln unchanged.

// E2B keys: Kiln keys in the form every E2B SDK accepts ("e2b_" and hex).
const (
	e2bKeyA = "e2b_" + "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
	e2bKeyB = "e2b_" + "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
)

// e2bAPI is an API with the E2B surface mounted and two tenants, over e's
// stores, with a python worker.
func (e *env) e2bAPI(t *testing.T) *httptest.Server {
	t.Helper()
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond, TracerProvider: e.tp,
		APIKeys: map[string]string{e2bKeyA: "acme", e2bKeyB: "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	d := producer.DomainOf(srv)
	d.Mount(e2bapi.New(d, slog.New(slog.NewTextHandler(io.Discard, nil)), e2bapi.WithKeepAlive(time.Second)))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	t.Cleanup(srv.Close)
	e.startWorker(t, "e2e-e2b", 2, withImages(map[string]string{"python": pythonImage(t), "node": recipeImage(t, "node")}))
	return hs
}

// e2bReport is what testdata/e2b-npm/contract.cjs reports.
type e2bReport struct {
	Pkg       string `json:"pkg"`
	SandboxID string `json:"sandboxId"`
	Failed    *struct {
		Step  string `json:"step"`
		Error string `json:"error"`
	} `json:"failed"`
	Steps struct {
		Stdout struct {
			Stdout []string `json:"stdout"`
			Stderr []string `json:"stderr"`
			Error  any      `json:"error"`
			Count  int      `json:"count"`
		} `json:"stdout"`
		State struct {
			Text string `json:"text"`
			Main []bool `json:"main"`
		} `json:"state"`
		DataFrame struct {
			Formats [][]string `json:"formats"`
			HTML    []string   `json:"html"`
		} `json:"dataframe"`
		Chart struct {
			Formats [][]string `json:"formats"`
			PNG     []int      `json:"png"`
			Error   any        `json:"error"`
		} `json:"chart"`
		Exception struct {
			Name      string   `json:"name"`
			Value     string   `json:"value"`
			Traceback string   `json:"traceback"`
			Callback  []string `json:"callback"`
		} `json:"exception"`
		Callbacks struct {
			Lines            []string `json:"lines"`
			FirstBeforeEndMs int64    `json:"firstBeforeEndMs"`
		} `json:"callbacks"`
		Interrupt struct {
			GaveUp     string `json:"gaveUp"`
			Marker     string `json:"marker"`
			NextDoneMs int64  `json:"nextDoneMs"`
		} `json:"interrupt"`
		Commands struct {
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
			ExitCode int    `json:"exitCode"`
			ExitErr  *struct {
				Name     string `json:"name"`
				ExitCode int    `json:"exitCode"`
				Stdout   string `json:"stdout"`
			} `json:"exitErr"`
			PID            int    `json:"pid"`
			SeenBeforeKill string `json:"seenBeforeKill"`
			Killed         bool   `json:"killed"`
			WaitErr        *struct {
				Name     string `json:"name"`
				ExitCode int    `json:"exitCode"`
			} `json:"waitErr"`
			Listed []struct {
				PID  int      `json:"pid"`
				Cmd  string   `json:"cmd"`
				Args []string `json:"args"`
				Cwd  string   `json:"cwd"`
			} `json:"listed"`
			Fed       string `json:"fed"`
			LateStdin string `json:"lateStdin"`
		} `json:"commands"`
		Contexts struct {
			Languages []string `json:"languages"`
		} `json:"contexts"`
		JSContext struct {
			First       string   `json:"first"`
			Second      []string `json:"second"`
			Fresh       string   `json:"fresh"`
			Error       any      `json:"error"`
			Languages   []string `json:"languages"`
			After       []bool   `json:"after"`
			RestartedJS []string `json:"restartedJs"`
			RestartedPy []string `json:"restartedPy"`
		} `json:"jsContext"`
		Files struct {
			Written   string   `json:"written"`
			Read      string   `json:"read"`
			Code      []string `json:"code"`
			Top       []string `json:"top"`
			Inner     []string `json:"inner"`
			Exists    bool     `json:"exists"`
			After     []string `json:"after"`
			AfterData []string `json:"afterData"`
			Watched   []string `json:"watched"`
		} `json:"files"`
		Info struct {
			Metadata      map[string]string `json:"metadata"`
			State         string            `json:"state"`
			TemplateID    string            `json:"templateId"`
			EndAfterStart bool              `json:"endAfterStart"`
		} `json:"info"`
		List struct {
			IDs      []string            `json:"ids"`
			Metadata []map[string]string `json:"metadata"`
			None     int                 `json:"none"`
		} `json:"list"`
		Connect struct {
			Text string `json:"text"`
		} `json:"connect"`
		Kill struct {
			Killed    bool   `json:"killed"`
			AfterKill string `json:"afterKill"`
		} `json:"kill"`
	} `json:"steps"`
}

// Acceptance 1 of issue 38: E2B's published SDK, at the latest release
// and at the oldest that can be pointed elsewhere (package.json), runs the
// contract against a live Kiln with nothing but E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY set.
func TestE2BContract(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "internal", "e2e", "testdata", "e2b-npm")
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatal(err)
	}
	aliases := make([]string, 0, len(pkg.Dependencies))
	for a := range pkg.Dependencies {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", a, "package.json")); err != nil {
			testenv.Unavailable(t, "E2B's SDK %s is not installed: run `npm ci` in internal/e2e/testdata/e2b-npm (make sdk-deps does): %v", a, err)
		}
		aliases = append(aliases, a)
	}
	slices.Sort(aliases)
	if len(aliases) != 2 {
		t.Fatalf("package.json pins %v; the contract runs two releases", aliases)
	}
	node := lookTool(t, "node")
	e := setup(t)
	hs := e.e2bAPI(t)
	for _, alias := range aliases {
		t.Run(alias+" "+pkg.Dependencies[alias], func(t *testing.T) {
			run := fmt.Sprintf("run-%d", time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "contract.cjs", alias, run)
			cmd.Dir = dir
			// Only the variables a user of E2B's SDK sets, and what node needs to run.
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
				"E2B_API_URL=" + hs.URL, "E2B_SANDBOX_URL=" + hs.URL, "E2B_API_KEY=" + e2bKeyA}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var rep e2bReport
			if jerr := json.Unmarshal(out, &rep); jerr != nil {
				t.Fatalf("contract.cjs: %v; stdout %q; stderr %s", err, out, stderr.String())
			}
			if rep.Failed != nil || err != nil {
				t.Fatalf("contract.cjs (%v) failed at %+v\nstderr: %s", err, rep.Failed, stderr.String())
			}
			st := rep.Steps
			if got := strings.Join(st.Stdout.Stdout, ""); got != "hello from envs\n" || st.Stdout.Error != nil || st.Stdout.Count < 1 {
				t.Errorf("stdout and envs: %+v", st.Stdout)
			}
			if st.State.Text != "42" || !slices.Equal(st.State.Main, []bool{true}) {
				t.Errorf("state across calls: %+v", st.State)
			}
			if len(st.DataFrame.HTML) != 1 || !strings.Contains(st.DataFrame.HTML[0], "<table") || !slices.Contains(st.DataFrame.Formats[0], "html") {
				t.Errorf("DataFrame: %+v", st.DataFrame)
			}
			pngs := 0
			for i, f := range st.Chart.Formats {
				if slices.Contains(f, "png") && st.Chart.PNG[i] > 1000 {
					pngs++
				}
			}
			if pngs != 1 || st.Chart.Error != nil {
				t.Errorf("chart without savefig: %+v", st.Chart)
			}
			ex := st.Exception
			if ex.Name != "ZeroDivisionError" || ex.Value != "division by zero" || !strings.Contains(ex.Traceback, "line 2, in f") ||
				!strings.HasSuffix(ex.Traceback, "ZeroDivisionError: division by zero") || !slices.Equal(ex.Callback, []string{"ZeroDivisionError"}) {
				t.Errorf("exception: %+v", ex)
			}
			if strings.Join(st.Callbacks.Lines, "") != "one\ntwo\n" {
				t.Errorf("onStdout: %q", st.Callbacks.Lines)
			}
			// The program sleeps 3 s after its first line: a line that
			// came with the call's end would be 0 s before it.
			if st.Callbacks.FirstBeforeEndMs < 1500 {
				t.Errorf("onStdout heard the first line %d ms before the call ended; the program printed it 3 s before", st.Callbacks.FirstBeforeEndMs)
			}
			// A call left running would end at its own wall clock (a
			// session call's default, 10 s), and the next call after it.
			if in := st.Interrupt; in.GaveUp != "TimeoutError" || in.Marker != "before\n" || in.NextDoneMs > 6_000 {
				t.Errorf("a call its client gave up on: %+v; want a TimeoutError, the call interrupted (marker before), the next call done within 6 s", in)
			}
			if c := st.Commands; c.Stdout != "out-42 from envs\n/work\npayload 1" || c.Stderr != "err\n" || c.ExitCode != 0 {
				t.Errorf("commands.run: %+v", c)
			}
			if e := st.Commands.ExitErr; e == nil || e.Name != "CommandExitError" || e.ExitCode != 3 || e.Stdout != "before\n" {
				t.Errorf("commands.run exiting 3: %+v", e)
			}
			if c := st.Commands; c.PID <= 0 || c.SeenBeforeKill != "started\n" || !c.Killed || c.WaitErr == nil || c.WaitErr.ExitCode == 0 {
				t.Errorf("a background command, streamed then killed: %+v (wait: %+v)", c, c.WaitErr)
			}
			if l := st.Commands.Listed; len(l) != 1 || l[0].PID != st.Commands.PID || l[0].Cmd != "/bin/bash" ||
				!slices.Equal(l[0].Args, []string{"-l", "-c", "echo started; sleep 60; echo never"}) || l[0].Cwd != "/home/user" {
				t.Errorf("commands.list with one command running: %+v; want it alone, as started", l)
			}
			if c := st.Commands; c.Fed != "got one two\n" || c.LateStdin == "" {
				t.Errorf("a command fed by sendStdin: %q; a write after it ended: %q (want an error)", c.Fed, c.LateStdin)
			}
			if !slices.Equal(st.Contexts.Languages, []string{"python"}) {
				t.Errorf("contexts: %+v", st.Contexts)
			}
			if j := st.JSContext; j.First != "41" || strings.Join(j.Second, "") != "js 42\n" || strings.Trim(j.Fresh, "'") != "undefined" || j.Error != nil ||
				!slices.Equal(j.Languages, []string{"python", "javascript", "javascript"}) || slices.Contains(j.After, true) || len(j.After) != 2 {
				t.Errorf("a JavaScript context: %+v", j)
			}
			if j := st.JSContext; strings.Join(j.RestartedJS, "") != "undefined\n" || strings.Join(j.RestartedPy, "") != "False kept\n" {
				t.Errorf("contexts restarted: javascript %q, python %q; want their state gone, the files kept", j.RestartedJS, j.RestartedPy)
			}
			f := st.Files
			if f.Written != "/home/user/data/notes.txt" || f.Read != "payload 1" || strings.Join(f.Code, "") != "payload 1\n" || !f.Exists ||
				!slices.Contains(f.Top, "dir:data") || !slices.Equal(f.Inner, []string{"file:notes.txt:9"}) ||
				slices.Contains(f.After, "gone.txt") || !slices.Equal(f.AfterData, []string{"moved.txt"}) {
				t.Errorf("files: %+v", f)
			}
			if !slices.Equal(f.Watched, []string{"create:watched.txt"}) {
				t.Errorf("files.watchDir of data/ while data/watched.txt and elsewhere.txt were written: %q; want the one creation", f.Watched)
			}
			if in := st.Info; !reflect.DeepEqual(in.Metadata, map[string]string{"suite": "e2b-contract", "run": run}) || in.State != "running" ||
				in.TemplateID != "code-interpreter-v1" || !in.EndAfterStart {
				t.Errorf("getInfo: %+v", in)
			}
			if l := st.List; !slices.Equal(l.IDs, []string{rep.SandboxID}) || l.None != 0 || l.Metadata[0]["run"] != run {
				t.Errorf("list by metadata: %+v (sandbox %s)", l, rep.SandboxID)
			}
			if st.Connect.Text != "41" {
				t.Errorf("a second client's runCode: %+v", st.Connect)
			}
			if !st.Kill.Killed || st.Kill.AfterKill != "SandboxNotFoundError" && st.Kill.AfterKill != "NotFoundError" {
				t.Errorf("kill: %+v", st.Kill)
			}
		})
	}
}

// e2bDo sends an E2B request: to the control plane with key, or to a
// sandbox's port with its access token.
func e2bDo(t *testing.T, base, method, path string, body any, hdr map[string]string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// e2bLines reads an /execute answer's lines.
func e2bLines(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["type"] != "keepalive" {
			out = append(out, m)
		}
	}
	return out
}

// Acceptances 2 and 3 of issue 38: the same code through the E2B surface
// and through the native session call gives the same stdout, PNG, HTML and
// error; the E2B calls are in the tenant's audit log as session calls; and
// another tenant's sandbox id is not found on every route of both planes.
func TestE2BSameAsNative(t *testing.T) {
	tp, exp := memTracing()
	e := setup(t, withTracerProvider(tp))
	hs := e.e2bAPI(t)
	ctl := func(key string) map[string]string { return map[string]string{"X-API-Key": key} }

	st, body := e2bDo(t, hs.URL, "POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 300}, ctl(e2bKeyA))
	if st != http.StatusCreated {
		t.Fatalf("create: %d %s", st, body)
	}
	var sbx struct {
		SandboxID, EnvdAccessToken string
	}
	if err := json.Unmarshal(body, &sbx); err != nil || sbx.SandboxID == "" || sbx.EnvdAccessToken == "" {
		t.Fatalf("create: %s (%v)", body, err)
	}
	a := &sessAPI{t: t, base: hs.URL}
	native := a.create(e2bKeyA, map[string]any{"runtime": "python"})
	jupyter := map[string]string{"E2b-Sandbox-Id": sbx.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sbx.EnvdAccessToken}

	var nativeCalls []job.CallResult
	codes := []string{
		"print('out'); import sys; print('err', file=sys.stderr)",
		"import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
		"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('same')",
		"def f():\n    raise ValueError('bad value')\nf()",
	}
	for _, code := range codes {
		st, body := e2bDo(t, hs.URL, "POST", "/execute", map[string]any{"code": code}, jupyter)
		if st != http.StatusOK {
			t.Fatalf("execute %q: %d %s", code, st, body)
		}
		lines := e2bLines(t, body)
		want := a.exec(e2bKeyA, native.ID, code)
		nativeCalls = append(nativeCalls, want)
		var stdout, stderr string
		var results []map[string]any
		var errLine map[string]any
		for _, l := range lines {
			switch l["type"] {
			case "stdout":
				stdout += l["text"].(string)
			case "stderr":
				stderr += l["text"].(string)
			case "result":
				results = append(results, l)
			case "error":
				errLine = l
			}
		}
		if last := lines[len(lines)-1]; last["type"] != "end_of_execution" {
			t.Errorf("%q: the stream ends with %v", code, last)
		}
		if stdout != want.Stdout || stderr != want.Stderr {
			t.Errorf("%q: stdout %q stderr %q; native %q %q", code, stdout, stderr, want.Stdout, want.Stderr)
		}
		if len(results) != len(want.Outputs) {
			t.Fatalf("%q: %d results; native %d outputs", code, len(results), len(want.Outputs))
		}
		for i, o := range want.Outputs {
			for mime, key := range map[string]string{job.MIMEPNG: "png", job.MIMEHTML: "html"} {
				got, _ := results[i][key].(string)
				if got != o.Text(mime) {
					t.Errorf("%q: result %d %s differs from the native output's %s (%d and %d bytes)", code, i, key, mime, len(got), len(o.Text(mime)))
				}
			}
			if results[i]["is_main_result"] != (o.Type == job.OutputResult) {
				t.Errorf("%q: result %d is_main_result %v; native %s", code, i, results[i]["is_main_result"], o.Type)
			}
		}
		switch ex := want.Error; {
		case ex == nil && errLine != nil:
			t.Errorf("%q: error %v; native none", code, errLine)
		case ex != nil && (errLine == nil || ex.Exception == nil || errLine["name"] != ex.Exception.Type || errLine["value"] != ex.Exception.Message):
			t.Errorf("%q: error %v; native %+v", code, errLine, ex)
		}
	}
	if st, body := a.do(e2bKeyA, "GET", "/v1/audit?kind=session_call&limit=100", nil); st != http.StatusOK {
		t.Fatalf("audit: %d %s", st, body)
	} else {
		var got struct {
			Records []job.AuditRecord `json:"records"`
		}
		_ = json.Unmarshal(body, &got)
		calls := 0
		for _, r := range got.Records {
			if r.SessionID == sbx.SandboxID {
				calls++
				if r.Key == "" || r.CodeSHA256 == "" {
					t.Errorf("audit record without its key or code: %+v", r)
				}
				// Its trace, as a native call's below.
				checkCallTrace(t, exp, a.call(e2bKeyA, sbx.SandboxID, r.Call))
			}
		}
		if calls != len(codes) {
			t.Errorf("audit: %d session calls of the E2B sandbox; want %d\n%s", calls, len(codes), body)
		}
	}
	for _, c := range nativeCalls {
		checkCallTrace(t, exp, c)
	}

	// Another tenant: its key on the control plane, and the sandbox's id
	// with any token but the sandbox's on the data plane, find nothing.
	id := sbx.SandboxID
	for _, r := range []struct{ method, path string }{
		{"GET", "/sandboxes/" + id}, {"DELETE", "/sandboxes/" + id}, {"POST", "/sandboxes/" + id + "/timeout"},
		{"POST", "/sandboxes/" + id + "/connect"}, {"POST", "/v2/sandboxes/" + id + "/connect"},
		{"POST", "/sandboxes/" + id + "/pause"}, {"POST", "/sandboxes/" + id + "/resume"},
	} {
		if st, body := e2bDo(t, hs.URL, r.method, r.path, map[string]any{"timeout": 10}, ctl(e2bKeyB)); st != http.StatusNotFound {
			t.Errorf("globex %s %s: %d %s", r.method, r.path, st, body)
		}
	}
	st, body = e2bDo(t, hs.URL, "GET", "/v2/sandboxes", nil, ctl(e2bKeyB))
	if st != http.StatusOK || strings.Contains(string(body), id) {
		t.Errorf("globex's list: %d %s", st, body)
	}
	st, body = e2bDo(t, hs.URL, "POST", "/sandboxes", map[string]any{"templateID": "base"}, ctl(e2bKeyB))
	var other struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(body, &other); st != http.StatusCreated || err != nil {
		t.Fatalf("globex's sandbox: %d %s", st, body)
	}
	for _, tok := range []string{other.EnvdAccessToken, "not-a-token"} {
		for _, r := range []struct{ port, method, path string }{
			{"49999", "POST", "/execute"}, {"49999", "GET", "/contexts"}, {"49983", "GET", "/files?path=/home/user/x"},
			{"49983", "POST", "/files?path=/home/user/x"}, {"49983", "POST", "/filesystem.Filesystem/ListDir"},
			{"49983", "POST", "/filesystem.Filesystem/Stat"}, {"49983", "POST", "/process.Process/Start"},
			{"49983", "POST", "/process.Process/Connect"}, {"49983", "POST", "/process.Process/SendSignal"},
		} {
			h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": r.port, "X-Access-Token": tok}
			if st, body := e2bDo(t, hs.URL, r.method, r.path, map[string]any{"code": "print(1)", "path": "/home/user"}, h); st != http.StatusNotFound {
				t.Errorf("%s %s on port %s with another token: %d %s", r.method, r.path, r.port, st, body)
			}
		}
	}
	// The sandbox's own token and key still reach it.
	if st, body := e2bDo(t, hs.URL, "GET", "/sandboxes/"+id, nil, ctl(e2bKeyA)); st != http.StatusOK {
		t.Errorf("acme's sandbox after globex's attempts: %d %s", st, body)
	}
}

// checkCallTrace checks that session call c is one trace: the API's
// session.call span, and below it the worker's execute span with the
// session, the call, the digest that ran and the call's status.
func checkCallTrace(t *testing.T, exp *tracetest.InMemoryExporter, c job.CallResult) {
	t.Helper()
	if c.TraceID == "" {
		t.Errorf("call %d (%s): no trace_id", c.Seq, c.ID)
		return
	}
	var spans traceSpans
	// The answer can reach the client before the API's span ends.
	testkit.Eventually(t, 10*time.Second, "the spans of call "+c.ID, func() bool {
		spans = spansOf(exp, c.TraceID)
		return spans.has(ktrace.SpanSessionCall, ktrace.SpanExecute, ktrace.SpanSandboxWait, ktrace.SpanSandboxCollect)
	})
	call := spans.one(t, ktrace.SpanSessionCall)
	execute := spans.under(t, ktrace.SpanExecute, call)
	seq := strconv.FormatInt(c.Seq, 10)
	checkAttrs(t, call, map[attribute.Key]string{ktrace.CallSeqKey: seq, ktrace.RuntimeKey: "python"})
	checkAttrs(t, execute, map[attribute.Key]string{ktrace.CallSeqKey: seq, ktrace.RuntimeKey: "python",
		ktrace.OCIManifestDigestKey: c.Image.Digest, ktrace.StatusKey: string(c.Status), ktrace.SandboxBoxKey: "true"})
	if attrs(call)[ktrace.SessionIDKey] != attrs(execute)[ktrace.SessionIDKey] || attrs(call)[ktrace.SessionIDKey] == "" {
		t.Errorf("call %d: session.call's session %q, execute's %q", c.Seq, attrs(call)[ktrace.SessionIDKey], attrs(execute)[ktrace.SessionIDKey])
	}
	spans.under(t, ktrace.SpanSandboxCollect, execute)
}

// Issue 38: a client that goes away while its execution still waits behind
// another withdraws it: the code never runs, and the call is answered
// canceled once its turn comes; the call before it is untouched.
func TestE2BQueuedExecutionWithdrawn(t *testing.T) {
	e := setup(t)
	hs := e.e2bAPI(t)
	st, body := e2bDo(t, hs.URL, "POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 300}, map[string]string{"X-API-Key": e2bKeyA})
	var sbx struct{ SandboxID, EnvdAccessToken string }
	if st != http.StatusCreated || json.Unmarshal(body, &sbx) != nil {
		t.Fatalf("create: %d %s", st, body)
	}
	a := &sessAPI{t: t, base: hs.URL}
	jupyter := map[string]string{"E2b-Sandbox-Id": sbx.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sbx.EnvdAccessToken}
	calls := func() int64 {
		code, raw := a.do(e2bKeyA, "GET", "/v1/sessions/"+sbx.SandboxID, nil)
		var v struct {
			Calls int64 `json:"calls"`
		}
		if code != http.StatusOK || json.Unmarshal(raw, &v) != nil {
			t.Fatalf("the sandbox's session: %d %s", code, raw)
		}
		return v.Calls
	}
	first := calls() + 1
	done := make(chan []byte, 1)
	go func() {
		_, body := e2bDo(t, hs.URL, "POST", "/execute", map[string]any{"code": "import time\ntime.sleep(3)\nprint('first')"}, jupyter)
		done <- body
	}()
	waitCallState(t, a, e2bKeyA, sbx.SandboxID, first, job.CallRunning)

	ctx, cancel := context.WithCancel(t.Context())
	raw, _ := json.Marshal(map[string]any{"code": "open('withdrawn.txt', 'w').write('ran')\nprint('second')"})
	req, err := http.NewRequestWithContext(ctx, "POST", hs.URL+"/execute", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range jupyter {
		req.Header.Set(k, v)
	}
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		gone <- err
	}()
	waitCallState(t, a, e2bKeyA, sbx.SandboxID, first+1, job.CallQueued)
	cancel()
	<-gone

	if lines := e2bLines(t, <-done); len(lines) == 0 || lines[0]["text"] != "first\n" {
		t.Fatalf("the call before the withdrawn one: %v", lines)
	}
	code, body := a.do(e2bKeyA, "GET", fmt.Sprintf("/v1/sessions/%s/calls/%d?wait=30s", sbx.SandboxID, first+1), nil)
	var r job.CallResult
	if code != http.StatusOK || json.Unmarshal(body, &r) != nil || r.Status != job.StatusCanceled || r.Error == nil || !strings.Contains(r.Error.Message, "withdrawn") {
		t.Fatalf("the withdrawn call: %d %s; want canceled, withdrawn", code, body)
	}
	wantOut(t, a.exec(e2bKeyA, sbx.SandboxID, "import os\nprint(os.path.exists('withdrawn.txt'))"), "False")
}
