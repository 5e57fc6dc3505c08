package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/worker"
	"github.com/kilnrun/kiln/worker/egress"
)

// The documentation's shell examples run, as written, against a live API
// (real Redis, JetStream, a worker on containerd), so none can rot. Every
// fenced block of sh, bash, shell or console in README.md and docs/ carries
// a marker in an HTML comment just above it (invisible on the rendered
// page):
//
//	<!-- example: run
//	expect: "stdout":"42\n"
//	-->
//
// runs the block with bash (-e, pipefail) in a folder holding bin/kiln,
// examples/, sdk/ and kiln/ (this repository), with KILN_SERVER and
// KILN_API_KEY set and the docs' 127.0.0.1:8080 and localhost:8080 made the
// test API's address; it must exit 0 (or "exit: N") and its output hold
// every "expect:" text. The API is a kiln dev's: no API keys, so a key an
// example sends is not checked, and its one tenant may reach
// api.example.org, which the worker's egress proxy resolves to a server of
// the test's.
//
//	<!-- example: not run: a Kubernetes cluster -->
//
// marks a block the test cannot run, saying why.

// docExample is one shell block of a page.
type docExample struct {
	file   string
	line   int // of the opening fence
	code   string
	run    bool
	reason string   // why not run
	expect []string // texts the output must hold
	exit   int
}

func (d docExample) String() string { return fmt.Sprintf("%s:%d", d.file, d.line) }

// shellLangs are the fences' info strings of shell examples.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// docPages are the pages whose examples run: README.md and docs/**.md.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			pages = append(pages, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// parseExamples reads the shell blocks of a page and their markers; a
// shell block without a marker, or a marker on no block, is an error.
func parseExamples(file string, text string) ([]docExample, []error) {
	var out []docExample
	var errs []error
	lines := strings.Split(text, "\n")
	var marker *docExample
	markerLine := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "<!-- example:"):
			if marker != nil {
				errs = append(errs, fmt.Errorf("%s:%d: an example marker on no shell block", file, markerLine))
			}
			body := strings.TrimPrefix(trimmed, "<!-- example:")
			for !strings.Contains(body, "-->") && i+1 < len(lines) {
				i++
				body += "\n" + lines[i]
			}
			body, _, _ = strings.Cut(body, "-->")
			m := docExample{file: file}
			head, rest, _ := strings.Cut(strings.TrimSpace(body), "\n")
			switch {
			case strings.TrimSpace(head) == "run":
				m.run = true
			case strings.HasPrefix(strings.TrimSpace(head), "not run:"):
				m.reason = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(head), "not run:"))
			default:
				errs = append(errs, fmt.Errorf("%s:%d: a marker is \"run\" or \"not run: why\", not %q", file, i+1, head))
				marker = nil
				continue
			}
			for _, l := range strings.Split(rest, "\n") {
				l = strings.TrimSpace(l)
				switch {
				case l == "":
				case strings.HasPrefix(l, "expect:"):
					m.expect = append(m.expect, strings.TrimSpace(strings.TrimPrefix(l, "expect:")))
				case strings.HasPrefix(l, "exit:"):
					m.exit, _ = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "exit:")))
				default:
					errs = append(errs, fmt.Errorf("%s:%d: a marker line is expect: or exit:, not %q", file, i+1, l))
				}
			}
			marker, markerLine = &m, i+1
		case strings.HasPrefix(trimmed, "```"):
			lang := strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))
			start := i + 1
			var code []string
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				code = append(code, lines[i])
			}
			if !shellLangs[lang] {
				if marker != nil {
					errs = append(errs, fmt.Errorf("%s:%d: an example marker on a %q block, not a shell one", file, markerLine, lang))
					marker = nil
				}
				continue
			}
			if marker == nil {
				errs = append(errs, fmt.Errorf("%s:%d: a shell example without a marker: put <!-- example: run --> (with expect: lines) "+
					"or <!-- example: not run: why --> just above it", file, start))
				continue
			}
			ex := *marker
			ex.line, ex.code = start, strings.Join(code, "\n")+"\n"
			out = append(out, ex)
			marker = nil
		case trimmed != "" && marker != nil:
			errs = append(errs, fmt.Errorf("%s:%d: an example marker not just above a shell block", file, markerLine))
			marker = nil
		}
	}
	return out, errs
}

// docsEnv is where the examples run: a folder laid out as the docs assume,
// and the environment they are given.
type docsEnv struct {
	dir string
	env []string
	api string // host:port
}

func newDocsEnv(t *testing.T, e *env, apiURL string) *docsEnv {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(buildKiln(t), filepath.Join(bin, "kiln")); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"examples": filepath.Join(root, "examples"), "sdk": filepath.Join(root, "sdk"), "kiln": root,
		// npx finds the pinned MCP inspector here, and fetches nothing.
		"node_modules": filepath.Join(root, "internal", "e2e", "testdata", "docs-npm", "node_modules"),
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "inspector")); err != nil {
		t.Fatalf("the docs' npm packages are not installed: run `npm ci` in internal/e2e/testdata/docs-npm (make sdk-deps does): %v", err)
	}
	pkg, err := os.ReadFile(filepath.Join(root, "internal", "e2e", "testdata", "docs-npm", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), pkg, 0o644); err != nil {
		t.Fatal(err)
	}
	d := &docsEnv{dir: dir, api: strings.TrimPrefix(apiURL, "http://")}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KILN_") || strings.HasPrefix(k, "OTEL_") || k == "PATH" {
			continue
		}
		d.env = append(d.env, kv)
	}
	d.env = append(d.env, "PATH="+bin+":"+os.Getenv("PATH"), "KILN_SERVER="+apiURL, "KILN_API_KEY=k-docs",
		"KILN_CONTAINERD_ADDRESS="+e.containerd, "KILN_CONTAINERD_NAMESPACE="+os.Getenv("KILN_CONTAINERD_NAMESPACE"),
		"npm_config_offline=true", "npm_config_update_notifier=false", "GOFLAGS=-mod=mod")
	return d
}

// run runs an example's code and checks its exit status and output; it
// returns what disagreed ("" when nothing did) and the output.
func (d *docsEnv) run(t *testing.T, ex docExample) (string, string) {
	t.Helper()
	code := strings.NewReplacer("127.0.0.1:8080", d.api, "localhost:8080", d.api).Replace(ex.code)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", code)
	cmd.Dir, cmd.Env = d.dir, d.env
	cmd.Stdin = nil // stdin is /dev/null: kiln mcp ends at once, as when its client goes
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return "did not end within 4 minutes", out.String()
	}
	got := exitCode(err)
	var bad []string
	if got != ex.exit {
		bad = append(bad, fmt.Sprintf("exit status %d, want %d", got, ex.exit))
	}
	for _, want := range ex.expect {
		if !strings.Contains(out.String(), want) {
			bad = append(bad, fmt.Sprintf("the output lacks %q", want))
		}
	}
	return strings.Join(bad, "; "), out.String()
}

// docsAPI is the API the examples run against: as kiln dev starts it (no
// keys; its tenant allowed api.example.org), with a worker whose egress
// proxy resolves api.example.org to a server of the test's.
func docsAPI(t *testing.T) (*env, string) {
	t.Helper()
	e := setup(t)
	far := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s%s\n", r.Host, r.URL.Path)
	}))
	t.Cleanup(far.Close)
	th, err := egress.ParseTestHosts("api.example.org=" + far.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	allowance, err := egressrule.ParseRules("api.example.org,*.data.gov:443")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), RuntimeCacheTTL: 100 * time.Millisecond,
		Tenants: map[string]producer.Tenant{job.DefaultTenant: {Egress: allowance}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	t.Cleanup(srv.StopLongPolls)
	hs := serveAPI(t, srv.Handler())
	e.startWorker(t, "w-docs", 2, withImages(map[string]string{"python": pythonImage(t)}),
		func(c *telemetry) { c.worker = func(w *worker.Config) { w.EgressTestHosts = th } })
	return e, hs.URL
}

// Every marked example of README.md and docs/ runs and says what it
// should; every shell example is marked. And the check can fail: the
// sessions example of docs/api.md without its Content-Type header (as it
// was once written) gets 415s and fails.
func TestDocsExamples(t *testing.T) {
	root := repoRoot(t)
	var all []docExample
	for _, page := range docPages(t, root) {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		exs, errs := parseExamples(page, string(b))
		for _, err := range errs {
			t.Error(err)
		}
		all = append(all, exs...)
	}
	runs := 0
	for _, ex := range all {
		if ex.run {
			runs++
			if len(ex.expect) == 0 {
				t.Errorf("%s: a run example with no expect: line checks only its exit status; say what its output shows", ex)
			}
		}
	}
	if runs < 10 {
		t.Fatalf("only %d examples to run in %d shell blocks: the pages are not read as expected", runs, len(all))
	}
	if t.Failed() {
		t.FailNow()
	}

	e, apiURL := docsAPI(t)
	d := newDocsEnv(t, e, apiURL)
	for _, ex := range all {
		if !ex.run {
			t.Logf("%s: not run: %s", ex, ex.reason)
			continue
		}
		bad, out := d.run(t, ex)
		if bad != "" {
			t.Errorf("%s: %s\n--- the example:\n%s--- its output:\n%s", ex, bad, ex.code, out)
		} else {
			t.Logf("%s: ran (%d lines of output)", ex, strings.Count(out, "\n"))
		}
	}

	// The control: without their Content-Type header, the sessions example
	// and the egress one (as they were once written) get 415s and fail.
	for _, c := range []struct{ file, marker string }{
		{filepath.Join("docs", "api.md"), "/v1/sessions"},
		{filepath.Join("docs", "egress.md"), "api.example.org"},
	} {
		var ex *docExample
		for i := range all {
			if all[i].file == c.file && all[i].run && strings.Contains(all[i].code, c.marker) && strings.Contains(all[i].code, "-H 'Content-Type: application/json'") {
				ex = &all[i]
				break
			}
		}
		if ex == nil {
			t.Fatalf("no example of %s sending Content-Type to %s to break", c.file, c.marker)
		}
		broken := *ex
		broken.code = strings.ReplaceAll(broken.code, " -H 'Content-Type: application/json'", "")
		bad, out := d.run(t, broken)
		if bad == "" {
			t.Errorf("%s without its Content-Type header passed the check; output:\n%s", ex, out)
			continue
		}
		t.Logf("%s without its Content-Type header fails, as it should: %s; output:\n%s", ex, bad, out)
	}
}

// The marker reader: what it takes, and what it refuses.
func TestDocsExamplesParse(t *testing.T) {
	t.Parallel()
	page := "intro\n<!-- example: run\nexpect: 42\nexit: 3\n-->\n```sh\necho 42; exit 3\n```\n\n" +
		"<!-- example: not run: a cluster -->\n```bash\nkubectl apply -k .\n```\n" +
		"```json\n{}\n```\n" +
		"```sh\nunmarked\n```\n" +
		"<!-- example: run -->\ntext between\n```sh\nx\n```\n" +
		"<!-- example: maybe -->\n```sh\ny\n```\n"
	exs, errs := parseExamples("p.md", page)
	if len(exs) != 2 || !exs[0].run || exs[0].exit != 3 || exs[0].expect[0] != "42" || exs[0].code != "echo 42; exit 3\n" ||
		exs[1].run || exs[1].reason != "a cluster" {
		t.Errorf("examples %+v", exs)
	}
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	joined := strings.Join(msgs, "\n")
	for _, want := range []string{"p.md:17: a shell example without a marker", "p.md:20: an example marker not just above",
		"p.md:22: a shell example without a marker", "p.md:25: a marker is \"run\" or \"not run: why\", not \"maybe\""} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors lack %q:\n%s", want, joined)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(joined))
	n := 0
	for sc.Scan() {
		n++
	}
	if n != 5 {
		t.Errorf("%d errors, want 5 (the unmarked block, the marker before text, the block after it, the bad marker, its block):\n%s", n, joined)
	}
}
