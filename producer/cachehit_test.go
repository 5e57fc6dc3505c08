package producer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// hit asserts that r is a cache hit with stdout, recorded under its id.
func (b *bundle) hit(t *testing.T, r response, stdout string, hdr ...string) job.Result {
	t.Helper()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 (cache hit); body %s", r.StatusCode, r.body)
	}
	var res job.Result
	r.decode(t, &res)
	if !res.CacheHit || res.Stdout != stdout || res.Status != job.StatusSucceeded || !job.ValidID(res.ID) {
		t.Fatalf("cache hit answer: %s; want stdout %q", r.body, stdout)
	}
	got := b.do(t, http.MethodGet, "/v1/jobs/"+res.ID, "", hdr...)
	var rec job.Result
	got.decode(t, &rec)
	if got.StatusCode != http.StatusOK || rec.ID != res.ID || !rec.CacheHit || rec.Stdout != stdout {
		t.Fatalf("GET of the hit's id: %d %s", got.StatusCode, got.body)
	}
	return res
}

// roundTrips returns the commands clients (not scripts) sent Redis about
// job records and result-cache entries, and the MULTI and EXEC around
// them, while f ran, as MONITOR shows them.
func (b *bundle) roundTrips(t *testing.T, f func()) []string {
	t.Helper()
	conn, err := net.Dial("tcp", b.redis.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	f()
	marker := "end-of-" + job.NewID()
	if err := b.rdb.Echo(context.Background(), marker).Err(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("MONITOR: %v", err)
		}
		switch {
		case strings.Contains(line, marker):
			return out
		case strings.Contains(line, " lua]"):
		case strings.Contains(line, `"kiln:job:`), strings.Contains(line, `"kiln:result:`),
			strings.Contains(line, `"multi"`), strings.Contains(line, `"exec"`):
			out = append(out, strings.TrimSpace(line))
		}
	}
}

// A hit of an entry the API read before is answered in one round trip,
// and still answers exactly what Redis holds: a replaced entry answers its
// new result, an expired one is a miss, and a max_age is checked as before.
func TestRepeatedCacheHitsFollowTheEntryInRedis(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now()) // the registry is never read again
	b := setup(t, func(c *Config) { c.Now = clock.Now })
	const spec = `{"code":"print('hi')"}`
	accepted(t, b.submit(t, spec))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := b.worker(t, ctx, succeeded("first\n"))
	if err != nil {
		t.Fatal(err)
	}
	b.hit(t, b.submit(t, spec), "first\n") // read with a GET: now known
	b.hit(t, b.submit(t, spec), "first\n")

	// One transaction: the entry read, the record written with its TTL.
	var r response
	sent := b.roundTrips(t, func() { r = b.submit(t, spec) })
	b.hit(t, r, "first\n")
	want := []string{`"multi"`, `"get" "kiln:result:`, `"hset" "kiln:job:`, `"pexpire" "kiln:job:`, `"exec"`}
	ok := len(sent) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(sent[i], want[i])
	}
	if !ok {
		t.Fatalf("a repeated hit sent Redis:\n%s\nwant GET, HSET, PEXPIRE in one transaction", strings.Join(sent, "\n"))
	}

	// Another run of the same key replaced the entry (as after a max_age
	// miss on another API process): the next hit answers the new result.
	newer := job.Result{ID: first.ID, Status: job.StatusSucceeded, ExitCode: job.IntPtr(0)}
	newer.SetOutput([]byte("newer\n"), nil)
	now := time.Now().UTC()
	newer.FinishedAt = &now
	if err := b.store.StoreResult(ctx, first.Key, newer); err != nil {
		t.Fatal(err)
	}
	b.hit(t, b.submit(t, spec), "newer\n")
	b.hit(t, b.submit(t, spec), "newer\n")

	// An entry older than the spec's max_age is a miss whether or not it
	// is known; the job runs and replaces it.
	old := time.Now().UTC().Add(-5 * time.Minute) // within the default max age (10m)
	newer.FinishedAt = &old
	if err := b.store.StoreResult(ctx, first.Key, newer); err != nil {
		t.Fatal(err)
	}
	b.hit(t, b.submit(t, spec), "newer\n") // known again, 5 minutes old
	accepted(t, b.submit(t, `{"code":"print('hi')","cache":{"max_age_s":60}}`))
	if _, err := b.worker(t, ctx, succeeded("rerun\n")); err != nil {
		t.Fatal(err)
	}
	b.hit(t, b.submit(t, spec), "rerun\n")

	// Expired: a miss.
	b.rdb.Del(ctx, "kiln:result:"+first.Key)
	accepted(t, b.submit(t, spec))
}

// A tenant is never answered with another tenant's entry, known or not.
func TestKnownCacheHitsStayWithTheirTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-alice": "alice", "k-bob": "bob"} })
	const spec = `{"code":"print('mine')"}`
	accepted(t, b.submit(t, spec, as("k-alice")...))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.worker(t, ctx, succeeded("alice's\n")); err != nil {
		t.Fatal(err)
	}
	b.hit(t, b.submit(t, spec, as("k-alice")...), "alice's\n", as("k-alice")...)
	b.hit(t, b.submit(t, spec, as("k-alice")...), "alice's\n", as("k-alice")...)
	accepted(t, b.submit(t, spec, as("k-bob")...))
}

// A hit's answer made from its entry's template is byte for byte the one
// encoding/json writes for the same view, whatever the entry holds.
func TestHitTemplateAnswersAsTheEncoder(t *testing.T) {
	t.Parallel()
	finished := time.Date(2026, 11, 25, 3, 4, 5, 600, time.UTC)
	plain := job.Result{ID: "01a21082-330f-739c-91bd-acb7b35d8d68", Status: job.StatusSucceeded, ExitCode: job.IntPtr(0),
		WallMS: 12, Attempt: 1, Worker: "w-1", QueueMS: 3, StartedAt: &finished, FinishedAt: &finished, TraceID: "abc"}
	plain.SetOutput([]byte("1\n"), nil)

	rich := plain
	rich.Status = job.StatusFailed
	rich.ExitCode = job.IntPtr(1)
	rich.SetOutput([]byte("quotes \" and \\ <b>&amp;</b> é 😀 \x01\x7f\n"), []byte("Traceback ...\nZeroDivisionError\n"))
	rich.StdoutTruncated = true
	rich.Error = job.NewFailure(job.CategoryRuntimeError, "ZeroDivisionError: division by zero")
	rich.Limits = &job.DefaultLimits
	rich.Image = job.Image{Name: "kiln/python:3.13", Digest: "sha256:0123"}
	rich.Redactions = map[string]int{"aws": 2, "github": 1}
	rich.Outputs = []job.Output{{Type: "display", Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"42"`)}}}
	rich.Egress = &job.Egress{}

	binary := plain
	binary.SetOutput([]byte{0xff, 0xfe, 'x'}, nil) // not UTF-8: base64

	at := time.Date(2026, 11, 25, 4, 0, 0, 123456000, time.UTC)
	for name, res := range map[string]job.Result{"plain": plain, "rich": rich, "binary": binary} {
		tmpl := newHitTemplate(res)
		if tmpl == nil {
			t.Fatalf("%s: no template", name)
		}
		for _, trace := range []string{"", "4bf92f3577b34da6a3ce929d0e0e4736"} {
			id := job.NewID()
			view := cacheHitView(res, id, trace, at, nil)
			view.Links = jobLinks(id)
			want, err := marshal(view)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := tmpl.render(nil, id, trace, at)
			if !ok || !bytes.Equal(got, want) {
				t.Fatalf("%s, trace %q:\n got %s\nwant %s", name, trace, got, want)
			}
			// And so is the answer writeBody sends for the view.
			view.tmpl = tmpl
			rec := httptest.NewRecorder()
			(&resultWriter{}).writeBody(context.Background(), rec, http.StatusOK, view)
			if !bytes.Equal(rec.Body.Bytes(), want) || rec.Header().Get("Content-Length") != strconv.Itoa(len(want)) {
				t.Fatalf("%s, trace %q: writeBody sent\n%s (%s)\nwant %s", name, trace, rec.Body, rec.Header(), want)
			}
		}
	}

	// What would need escaping is not rendered; writeBody encodes it.
	if _, ok := newHitTemplate(plain).render(nil, `a"b`, "", at); ok {
		t.Fatal("rendered an id that needs escaping")
	}
	view := cacheHitView(plain, `a"b`, "", at, nil)
	view.tmpl = newHitTemplate(plain)
	want, err := marshal(view)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	(&resultWriter{}).writeBody(context.Background(), rec, http.StatusOK, view)
	if !bytes.Equal(rec.Body.Bytes(), want) {
		t.Fatalf("writeBody of an id that needs escaping sent\n%s\nwant %s", rec.Body, want)
	}
}
