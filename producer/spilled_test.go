package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// spilledRun is a worker's run whose stdout (out) is kept in the object
// store, as a worker does with output over job.MaxInlineOutputBytes.
func spilledRun(t *testing.T, b *bundle, out []byte) func(job.Message) job.Result {
	return func(m job.Message) job.Result {
		sum := sha256.Sum256(out)
		ref := job.ObjectRef{Tenant: m.Tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(out))}
		if err := blob.New(b.js, blob.Config{}).Put(context.Background(), ref, bytes.NewReader(out)); err != nil {
			t.Fatal(err)
		}
		res := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), StdoutBytes: int64(len(out))}
		res.SetOutput(nil, []byte("inline stderr\n"))
		res.StdoutObject = job.NewOutputObject(ref, out)
		return res
	}
}

// Output kept in the object store reads back whole from every route: GET
// streams it, a list inlines it within its bound, a cache hit serves it
// while the object is stored; once the object is gone, GET says so and a
// resubmission runs again instead of a cache hit without output.
func TestSpilledOutputReadsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxListBytes = 1 << 20 })
	ctx := context.Background()
	texts := [][]byte{
		bytes.Repeat([]byte("x"), 600<<10),
		append(bytes.Repeat([]byte("\x01\"<é"), 100<<10), 0xff, 0xfe), // control bytes, quotes, invalid UTF-8
	}
	var ids []string
	for i, out := range texts {
		ids = append(ids, accepted(t, b.submit(t, `{"code":"print(`+strconv.Itoa(i)+`)"}`)).ID)
		if _, err := b.worker(t, ctx, spilledRun(t, b, out)); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "")
		var v job.Result
		r.decode(t, &v)
		var want job.Result
		want.SetOutput(texts[i], []byte("inline stderr\n"))
		if r.StatusCode != 200 || v.Stdout != want.Stdout || v.StdoutBase64 != want.StdoutBase64 || v.Stderr != want.Stderr {
			t.Fatalf("GET job %d: %d, stdout %d bytes (right: %v), base64 right: %v, stderr %q", i, r.StatusCode, len(v.Stdout), v.Stdout == want.Stdout, v.StdoutBase64 == want.StdoutBase64, v.Stderr)
		}
		if r.Header.Get("Content-Length") != "" {
			t.Errorf("a streamed answer has a Content-Length")
		}
	}

	// A list: the first job's 600 KiB fits the 1 MiB bound; the second's
	// output would take it past, so it is named, not included.
	r := b.do(t, http.MethodGet, "/v1/jobs?ids="+strings.Join(ids, ","), "")
	var list struct {
		Jobs []struct {
			ID     string       `json:"id"`
			Stdout string       `json:"stdout"`
			Error  *problemBody `json:"error"`
		} `json:"jobs"`
	}
	r.decode(t, &list)
	if len(list.Jobs) != 2 || list.Jobs[0].Stdout != string(texts[0]) {
		t.Fatalf("list: %d jobs; first stdout right: %v", len(list.Jobs), len(list.Jobs) > 0 && list.Jobs[0].Stdout == string(texts[0]))
	}
	if e := list.Jobs[1].Error; e == nil || e.Type != string(job.ProblemResponseTooLarge) || !strings.Contains(e.Detail, "GET /v1/jobs/"+ids[1]) {
		t.Fatalf("list: the second job past the bound: %+v", list.Jobs[1])
	}

	// A cache hit of the first job carries its output.
	hit := b.do(t, http.MethodPost, "/v1/jobs", `{"code":"print(0)"}`)
	var hv job.Result
	hit.decode(t, &hv)
	if hit.StatusCode != 200 || !hv.CacheHit || hv.Stdout != string(texts[0]) {
		t.Fatalf("cache hit: %d, hit %v, stdout right %v", hit.StatusCode, hv.CacheHit, hv.Stdout == string(texts[0]))
	}

	// The object expires: GET says so; the same job again is not a hit.
	sum := sha256.Sum256(texts[0])
	obs, err := b.js.ObjectStore(ctx, blob.BucketDefault)
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(ctx, job.ObjectName(job.DefaultTenant, hex.EncodeToString(sum[:]))); err != nil {
		t.Fatal(err)
	}
	p := b.do(t, http.MethodGet, "/v1/jobs/"+ids[0], "").problem(t, http.StatusNotFound)
	if !strings.Contains(p.Detail, "no longer stored") {
		t.Fatalf("GET after the output expired: %+v", p)
	}
	again := b.do(t, http.MethodPost, "/v1/jobs", `{"code":"print(0)"}`)
	if again.StatusCode != http.StatusAccepted {
		t.Fatalf("resubmission after the output expired: %d, want 202 (a run, not a hit without output): %s", again.StatusCode, again.body)
	}
}
