package producer

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// An unsatisfiable or unparsable Range is answered 416 with a problem
// naming the Range header (and Content-Range giving the size); a good one
// is served as ServeContent serves it.
func TestArtifactRangeProblem(t *testing.T) {
	t.Parallel()
	content := []byte("0123456789")
	serve := func(rng string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/jobs/x/artifacts/a.txt", nil)
		req.Header.Set("Range", rng)
		rec := httptest.NewRecorder()
		rec.Header().Set("ETag", `"abc"`)
		rec.Header().Set("Content-Disposition", "attachment")
		http.ServeContent(&rangeProblemWriter{ResponseWriter: rec, rangeHdr: rng, name: "a.txt", size: int64(len(content))},
			req, "", time.Time{}, bytes.NewReader(content))
		return rec
	}
	for _, rng := range []string{"bytes=100-", "bytes=x"} {
		rec := serve(rng)
		var p problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: body %q is not a problem: %v", rng, rec.Body, err)
		}
		if rec.Code != http.StatusRequestedRangeNotSatisfiable || rec.Header().Get("Content-Type") != "application/problem+json" ||
			p.Status != http.StatusRequestedRangeNotSatisfiable || p.Type != job.ProblemInvalidParameter || p.Field != "Range" {
			t.Errorf("%s: %d %s %+v", rng, rec.Code, rec.Header().Get("Content-Type"), p)
		}
		if rec.Header().Get("ETag") != "" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s: a refusal with ETag %q, Cache-Control %q", rng, rec.Header().Get("ETag"), rec.Header().Get("Cache-Control"))
		}
	}
	if rec := serve("bytes=100-"); rec.Header().Get("Content-Range") != "bytes */10" {
		t.Errorf("Content-Range %q; want bytes */10", rec.Header().Get("Content-Range"))
	}
	if rec := serve("bytes=2-4"); rec.Code != http.StatusPartialContent || rec.Body.String() != "234" || rec.Header().Get("ETag") != `"abc"` {
		t.Errorf("a good range: %d %q", rec.Code, rec.Body)
	}
}
