package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// browser starts headless Chromium (Debian's chromium package, as
// deploy/local/deps.sh installs it) and returns a context driving one tab,
// and the messages its console logged.
func browser(t *testing.T) (context.Context, *consoleLog) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Unavailable(t, "chromium is not installed (deploy/local/deps.sh installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1800), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	console := &consoleLog{}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	entries := chromedp.Events(ctx, log.EntryAdded)
	go func() {
		for ev, err := range entries {
			if err != nil {
				return
			}
			console.add(ev.Entry.Text)
		}
	}()
	return ctx, console
}

// consoleLog is what a page's console and the browser's log reported.
type consoleLog struct {
	mu    sync.Mutex
	lines []string
	added chan struct{} // closed and replaced at each line
}

func (c *consoleLog) add(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, s)
	if c.added != nil {
		close(c.added)
	}
	c.added = make(chan struct{})
}

// waitFor reports whether a line holding sub was logged, waiting up to
// within for it.
func (c *consoleLog) waitFor(sub string, within time.Duration) bool {
	deadline := time.After(within)
	for {
		c.mu.Lock()
		for _, l := range c.lines {
			if strings.Contains(l, sub) {
				c.mu.Unlock()
				return true
			}
		}
		if c.added == nil {
			c.added = make(chan struct{})
		}
		next := c.added
		c.mu.Unlock()
		select {
		case <-next:
		case <-deadline:
			return false
		}
	}
}

// screenshot saves the tab's full page as name.png under the test's
// screenshot folder ($KILN_UI_SCREENSHOTS, or the test's temporary folder),
// logs where, and returns the image.
func screenshot(t *testing.T, ctx context.Context, name string) image.Image {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := os.Getenv("KILN_UI_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	t.Logf("screenshot %s: %s (%dx%d)", name, p, img.Bounds().Dx(), img.Bounds().Dy())
	return img
}

// coloured counts the pixels of img within r that are neither white, grey
// nor black: a chart's line, a status badge.
func coloured(img image.Image, r image.Rectangle) int {
	n := 0
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c0, c1, c2, _ := img.At(x, y).RGBA()
			hi, lo := max(c0, c1, c2), min(c0, c1, c2)
			if hi-lo > 0x3000 {
				n++
			}
		}
	}
	return n
}

// The run page in a real browser: a job that drew a chart and made a
// DataFrame, and a job that failed, render what their JSON says (the
// screenshots are kept and logged); a running job's output appears as it is
// written, then its result; another tenant's run is not found; and a run's
// HTML output runs no script (the frame is sandboxed, and Chromium says it
// blocked it).
func TestRunPageInChromium(t *testing.T) {
	ctx, console := browser(t)
	e := setup(t)
	e.startWorker(t, "w-runpage", 2)
	srv, err := producer.New(context.Background(), producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		APIKeys: map[string]string{"k-alice": "alice", "k-bob": "bob"}, TraceURL: "http://jaeger.test/trace/{trace_id}"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	// probes hears every request for a probe image (the HTML output's
	// below), in the order they come.
	probes := make(chan string, 64)
	hs := serveAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/ui/assets/probe-") {
			select {
			case probes <- strings.TrimPrefix(r.URL.Path, "/ui/assets/"):
			default:
			}
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	// awaitProbe waits for a request for probe name and says which probes
	// came before it.
	awaitProbe := func(name string) (before []string, ok bool) {
		deadline := time.After(30 * time.Second)
		for {
			select {
			case p := <-probes:
				if p == name {
					return before, true
				}
				before = append(before, p)
			case <-deadline:
				return before, false
			}
		}
	}
	alice, err := client.New(hs.URL, client.WithAPIKey("k-alice"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(code string) client.JobView {
		t.Helper()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sub, err := alice.Submit(rctx, job.Spec{Code: code, Cache: job.CacheOff()})
		if err != nil {
			t.Fatal(err)
		}
		v, err := alice.Wait(rctx, sub.ID)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	chart := run("print('drawing')\n" + dataFrameAndChart)
	failed := run("x = 1\ny = 0\nprint('before')\nprint(x / y)\n")
	// The output's script, did it run, would ask for one image, and its
	// plain HTML asks for another (after it): the server sees which.
	evil := run(`class Page:
    def _repr_html_(self):
        return ('<p id="inside">inside the frame</p>'
                '<script>new Image().src = "/ui/assets/probe-from-script.png"; '
                'parent.document.title = "pwned"; top.document.body.setAttribute("data-pwned", "1")</script>'
                '<img src="/ui/assets/probe-from-html.png">')
Page()
`)
	if chart.Status != job.StatusSucceeded || failed.Status != job.StatusFailed || evil.Status != job.StatusSucceeded {
		t.Fatalf("jobs: chart %s %+v, failed %s, evil %s %+v", chart.Status, chart.Error, failed.Status, evil.Status, evil.Error)
	}

	// Log in as a person does: the form, then the page it sends to.
	page := func(path string) string { return hs.URL + path }
	login := func(key, next string) error {
		return chromedp.Do(ctx,
			chromedp.Navigate(page("/ui/login?next="+next)),
			chromedp.SendKeys(chromedp.CSS(`input[name="key"]`), key),
			chromedp.Submit(chromedp.CSS(`form`)),
		)
	}
	// text reads the element's text in one evaluation in the page, again
	// while the page is being rendered anew (a live run's page loads its
	// result when the job ends): a query for the node and a second call for
	// its text fail when the node is replaced in between.
	text := func(sel string) string {
		t.Helper()
		js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e === null ? null : {text: e.innerText}; })()`, sel)
		var v *struct{ Text string }
		var err error
		if !testkit.Poll(10*time.Second, func() bool {
			v, err = chromedp.Run(ctx, chromedp.Evaluate[*struct{ Text string }](js))
			return err == nil && v != nil
		}) {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v.Text
	}
	attr := func(sel, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
		if err != nil || !v.Exists {
			t.Fatalf("attribute %s of %s: %v (exists %v)", name, sel, err, v.Exists)
		}
		return v.Value
	}
	waitFor := func(sel string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
			t.Fatalf("wait for %s: %v", sel, err)
		}
	}
	if err := login("k-alice", "/ui/jobs/"+chart.ID); err != nil {
		t.Fatalf("log in: %v", err)
	}
	waitFor(`[data-role="stdout"]`)

	// The chart job: its stdout, the chart as the PNG the JSON carries, the
	// DataFrame's HTML in a sandboxed frame, its digest and trace.
	stdout, status := text(`[data-role="stdout"]`), text(`[data-role="status"]`)
	imgSrc := attr(`img[data-role="image"]`, "src")
	sandbox, srcdoc := attr(`iframe[data-role="html"]`, "sandbox"), attr(`iframe[data-role="html"]`, "srcdoc")
	var wantPNG, wantHTML string
	for _, o := range chart.Outputs {
		if o.Has(job.MIMEPNG) {
			wantPNG = o.Text(job.MIMEPNG)
		}
		if o.Has(job.MIMEHTML) {
			wantHTML = o.Text(job.MIMEHTML)
		}
	}
	t.Logf("the chart job's JSON: status %s, stdout %q, %d outputs, PNG of %d base64 bytes, digest %s", chart.Status, chart.Stdout, len(chart.Outputs), len(wantPNG), chart.Image.Digest)
	if status != string(chart.Status) || stdout != chart.Stdout {
		t.Errorf("the page shows status %q, stdout %q; the JSON %q, %q", status, stdout, chart.Status, chart.Stdout)
	}
	if wantPNG == "" || imgSrc != "data:image/png;base64,"+wantPNG {
		t.Errorf("the page's image is not the JSON's PNG (%d vs %d bytes)", len(imgSrc), len(wantPNG))
	}
	if sandbox != "" || srcdoc != wantHTML || !strings.Contains(srcdoc, "<table") {
		t.Errorf("the DataFrame's frame: sandbox %q, srcdoc %.80q; want sandbox \"\" and the JSON's HTML", sandbox, srcdoc)
	}
	body := text(`main`)
	for _, want := range []string{chart.Image.Digest, chart.TraceID, "drawing"} {
		if !strings.Contains(body, want) {
			t.Errorf("the chart page does not show %q", want)
		}
	}
	shot := screenshot(t, ctx, "chart-job")
	box, err := chromedp.Run(ctx, chromedp.Evaluate[struct{ X, Y, W, H float64 }](`(() => { const r = document.querySelector('img[data-role="image"]').getBoundingClientRect(); `+
		`return {X: r.x + window.scrollX, Y: r.y + window.scrollY, W: r.width, H: r.height}; })()`))
	if err != nil {
		t.Fatal(err)
	}
	r := image.Rect(int(box.X), int(box.Y), int(box.X+box.W), int(box.Y+box.H))
	t.Logf("the chart is drawn at %v of the screenshot", r)
	if n := coloured(shot, r); r.Dx() < 100 || n < 200 {
		t.Errorf("the screenshot shows no chart where the image is (%d coloured pixels in %v)", n, r)
	}

	// The failed job: the exception the JSON names, at its line.
	exc := failed.Error.Exception
	if exc == nil {
		t.Fatalf("the failed job's JSON has no exception: %+v", failed.Error)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(page("/ui/jobs/"+failed.ID))); err != nil {
		t.Fatal(err)
	}
	waitFor(`[data-role="exception"]`)
	excType, excLine, category := text(`[data-role="exception-type"]`), text(`[data-role="exception-line"]`), text(`[data-role="category"]`)
	stderr, exit := text(`[data-role="stderr"]`), text(`[data-role="exit"]`)
	t.Logf("the failed job's JSON: %s, exit %d, %s: %s at line %d", failed.Status, failed.Code(), exc.Type, exc.Message, exc.Line)
	if excType != exc.Type || excLine != fmt.Sprint(exc.Line) || category != string(failed.Error.Category) || exit != fmt.Sprint(failed.Code()) ||
		!strings.Contains(stderr, "ZeroDivisionError") {
		t.Errorf("the page shows %s at line %s (%s, exit %s); the JSON %s at line %d (%s, exit %d); stderr %q",
			excType, excLine, category, exit, exc.Type, exc.Line, failed.Error.Category, failed.Code(), stderr)
	}
	screenshot(t, ctx, "failed-job")

	// A run's HTML output cannot script the page: the frame is sandboxed;
	// once the frame has rendered (its image was asked for), the page's
	// title and body are untouched and the script never ran (its image
	// was never asked for).
	if err := chromedp.Do(ctx, chromedp.Navigate(page("/ui/jobs/"+evil.ID))); err != nil {
		t.Fatal(err)
	}
	waitFor(`iframe[data-role="html"]`)
	before, ok := awaitProbe("probe-from-html.png")
	if !ok {
		t.Fatal("the HTML output's frame never rendered (its image was not asked for)")
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.body.hasAttribute("data-pwned")`))
	if err != nil {
		t.Fatal(err)
	}
	if title == "pwned" || pwned {
		t.Errorf("the output's script ran in the page: title %q, body marked %v", title, pwned)
	}
	if slices.Contains(before, "probe-from-script.png") {
		t.Error("the HTML output's script ran")
	}
	if console.waitFor("Blocked script execution", 0) {
		t.Logf("Chromium reported: the output's script was blocked")
	}
	screenshot(t, ctx, "html-output")
	// The control: the same HTML in a frame that may run scripts, on a
	// page of the API without the run page's policy (the document's JSON),
	// does ask for the script's image.
	if err := chromedp.Do(ctx, chromedp.Navigate(page("/openapi.json"))); err != nil {
		t.Fatal(err)
	}
	frame := fmt.Sprintf(`(() => { const f = document.createElement("iframe"); f.setAttribute("sandbox", "allow-scripts"); `+
		`f.srcdoc = '<script>new Image().src = "%s/ui/assets/probe-from-script.png"</script><img src="%s/ui/assets/probe-from-html.png">'; `+
		`document.body.append(f); return true; })()`, hs.URL, hs.URL)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](frame)); err != nil {
		t.Fatal(err)
	}
	if _, ok := awaitProbe("probe-from-script.png"); !ok {
		t.Error("the control: a frame allowed to run scripts did not ask for the script's image, so the check above could not fail")
	}

	// A job still running: its output appears as it is written, over the
	// event stream, then the page shows the result.
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slow, err := alice.Submit(rctx, job.Spec{Code: "import time\nprint('first', flush=True)\ntime.sleep(4)\nprint('second')", Cache: job.CacheOff()})
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(page("/ui/jobs/"+slow.ID))); err != nil {
		t.Fatal(err)
	}
	waitFor(`[data-role="live"]`)
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('[data-role="stdout"]').textContent.includes("first")`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the running job's first line never appeared: %v", err)
	}
	liveStatus, liveOut := text(`[data-role="status"]`), text(`[data-role="stdout"]`)
	if v, _ := alice.Get(rctx, slow.ID, 0); liveOut != "first\n" || v.Terminal() {
		t.Errorf("while running the page showed %q (status %s; the job is %s)", liveOut, liveStatus, v.Status)
	}
	screenshot(t, ctx, "running-job")
	// The page as reloaded with the result (run.js reloads it on the
	// result event; the live badge reads "succeeded" a moment before, and
	// a navigation of the test's then would be aborted by the reload).
	// Asked anew each time: an evaluation the reload cuts short fails.
	reloaded := `document.readyState === "complete" && document.querySelector('[data-role="live"]') === null && ` +
		`document.querySelector('[data-role="status"]') !== null && document.querySelector('[data-role="status"]').textContent === "succeeded"`
	var lastErr error
	if !testkit.Poll(60*time.Second, func() bool {
		var done bool
		done, lastErr = chromedp.Run(ctx, chromedp.Evaluate[bool](reloaded))
		return lastErr == nil && done
	}) {
		t.Fatalf("the page never showed the result: %v", lastErr)
	}
	liveOut = text(`[data-role="stdout"]`)
	if liveOut != "first\nsecond\n" {
		t.Errorf("after the result the page shows %q", liveOut)
	}

	// Another tenant's run: not found, for a browser logged in as bob.
	if _, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if err := login("k-bob", "/ui/jobs/"+chart.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(`[data-role="message"]`)
	if title, err = chromedp.Run(ctx, chromedp.Title()); err != nil {
		t.Fatal(err)
	}
	body = text(`main`)
	if !strings.HasPrefix(title, "Not found") || !strings.Contains(body, "No such job") || strings.Contains(body, chart.Stdout) {
		t.Errorf("bob's view of alice's job: title %q, body %q", title, body)
	}
	resp, err := http.Get(page("/ui/jobs/" + chart.ID))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the page without a key: %d", resp.StatusCode)
	}
	raw, _ := json.Marshal(map[string]string{"chart": chart.ID, "failed": failed.ID, "html": evil.ID, "live": slow.ID})
	t.Logf("jobs: %s", raw)
}
