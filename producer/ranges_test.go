package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

func TestPlanRanges(t *testing.T) {
	t.Parallel()
	many := func(n int, step int64) string {
		var parts []string
		for i := range n {
			parts = append(parts, fmt.Sprintf("%d-%d", int64(i)*step, int64(i)*step))
		}
		return "bytes=" + strings.Join(parts, ",")
	}
	alternating := "bytes=" + strings.Repeat("0-0,9999-9999,", 39) + "0-0,9999-9999"
	for _, c := range []struct {
		hdr  string
		want string // rangeHeader of the plan, or the error's kind
	}{
		{"bytes=2-4", "bytes=2-4"},
		{"bytes=5-", "bytes=5-9999"},
		{"bytes=-10", "bytes=9990-9999"},
		{"bytes=-20000", "bytes=0-9999"},
		{"bytes=0-99999", "bytes=0-9999"},
		{"bytes=500-600,0-10", "bytes=0-10,500-600"},   // sorted
		{"bytes=0-10,5-20,30-40", "bytes=0-40"},        // overlapping, then a small gap
		{"bytes=0-0,1000-1000", "bytes=0-0,1000-1000"}, // a gap worth a part of its own
		{alternating, "bytes=0-0,9999-9999"},           // 80 specs, two ranges
		{"bytes=0-0,20000-30000", "bytes=0-0"},         // the unsatisfiable one dropped
		{"bytes=0-1, ,2-3", "bytes=0-3"},               // empty list elements
		{many(MaxRanges, 1000), many(MaxRanges, 1000)}, // at the bound
		{many(MaxRanges+1, 1000), "too many"},          // past it
		{many(1000, 1), "too many"},                    // 1,000 specs refused unmerged
		{"bytes=-0", "unsatisfiable"},                  // selects nothing
		{"bytes=10000-", "unsatisfiable"},
		{"bytes=x", "syntax"}, {"bytes=4-2", "syntax"}, {"items=0-1", "syntax"}, {"bytes=-", "syntax"}, {"bytes=+1-2", "syntax"},
	} {
		rs, err := planRanges(c.hdr, 10000)
		got := ""
		switch {
		case errors.Is(err, errRangeTooMany):
			got = "too many"
		case errors.Is(err, errRangeUnsatisfiable):
			got = "unsatisfiable"
		case err != nil:
			got = "syntax"
		default:
			got = rangeHeader(rs)
		}
		if got != c.want {
			t.Errorf("%.60s: %s (%v), want %s", c.hdr, got, err, c.want)
		}
	}
}

// cpuTime is the process's user+system CPU time so far: the API and the
// embedded NATS server it reads the object store from both count.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Issue 23, acceptance 1: 40 alternating 1-byte range pairs on an 8 MiB
// artifact cost about one download (the ranges are merged and served in
// one pass), 1,000 ranges and bytes=-0 are refused with 416. Not parallel:
// it measures the process's CPU time.
func TestArtifactRangesBounded(t *testing.T) {
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-rng": "ranger"} })
	ctx := context.Background()
	content := make([]byte, 8<<20)
	for i := range content {
		content[i] = byte(i * 7)
	}
	sum := sha256.Sum256(content)
	ref := job.ObjectRef{Tenant: "ranger", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(content))}
	store, err := blob.Ensure(ctx, b.js, blob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(ctx, ref, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	v := accepted(t, b.submit(t, `{"code":"big()"}`))
	if _, err := b.worker(t, ctx, func(m job.Message) job.Result {
		r := succeeded("")(m)
		r.Artifacts = []job.Artifact{{Name: "big.bin", Size: ref.Size, SHA256: ref.SHA256, ContentType: "application/octet-stream"}}
		return r
	}); err != nil {
		t.Fatal(err)
	}
	path := "/v1/jobs/" + v.ID + "/artifacts/big.bin"

	b.do(t, http.MethodGet, path, "") // warm up: bind the bucket, open connections
	start := cpuTime(t)
	full := b.do(t, http.MethodGet, path, "")
	fullCPU := cpuTime(t) - start
	if full.StatusCode != http.StatusOK || !bytes.Equal(full.body, content) {
		t.Fatalf("full download: %d, %d bytes", full.StatusCode, len(full.body))
	}

	last := len(content) - 1
	pairs := "bytes=" + strings.Repeat(fmt.Sprintf("0-0,%d-%d,", last, last), 39) + fmt.Sprintf("0-0,%d-%d", last, last)
	start = cpuTime(t)
	r := b.do(t, http.MethodGet, path, "", "Range", pairs)
	rangesCPU := cpuTime(t) - start
	if r.StatusCode != http.StatusPartialContent {
		t.Fatalf("40 pairs: %d %s", r.StatusCode, r.body)
	}
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(bytes.NewReader(r.body), params["boundary"])
	var got []string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(p)
		got = append(got, fmt.Sprintf("%s=%x", p.Header.Get("Content-Range"), body))
	}
	want := []string{fmt.Sprintf("bytes 0-0/%d=%x", len(content), content[:1]), fmt.Sprintf("bytes %d-%d/%d=%x", last, last, len(content), content[last:])}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parts %v, want %v", got, want)
	}
	t.Logf("CPU: full 8 MiB download %v, 40 alternating range pairs %v (%.2f×)", fullCPU, rangesCPU, float64(rangesCPU)/float64(fullCPU))
	if rangesCPU > 3*fullCPU+50*time.Millisecond {
		t.Errorf("40 range pairs took %v of CPU, a full download %v: want at most ~3×", rangesCPU, fullCPU)
	}

	var thousand []string
	for i := range 1000 {
		thousand = append(thousand, fmt.Sprintf("%d-%d", i*1000, i*1000))
	}
	for _, hdr := range []string{"bytes=" + strings.Join(thousand, ","), "bytes=-0", "bytes=0-0,100-100,200-200,300-300,400-400,500-500,600-600,700-700,800-800"} {
		r := b.do(t, http.MethodGet, path, "", "Range", hdr)
		p := r.problem(t, http.StatusRequestedRangeNotSatisfiable)
		if p.Field != "Range" || r.Header.Get("Content-Range") != fmt.Sprintf("bytes */%d", len(content)) {
			t.Errorf("%.40s: %+v, Content-Range %q", hdr, p, r.Header.Get("Content-Range"))
		}
	}
	// A Range for another version of the artifact is ignored: the whole of it.
	if r := b.do(t, http.MethodGet, path, "", "Range", "bytes=-0", "If-Range", `"other"`); r.StatusCode != http.StatusOK || len(r.body) != len(content) {
		t.Errorf("If-Range of another ETag: %d, %d bytes", r.StatusCode, len(r.body))
	}
}
