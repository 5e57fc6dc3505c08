package producer

import (
	"fmt"
	"net/http"

	"github.com/kilnrun/kiln/job"
)

// rangeProblemWriter answers http.ServeContent's 416 (a Range the artifact
// cannot satisfy, or one that does not parse) with a problem, as the API
// answers every refused request, instead of ServeContent's plain-text line.
// The Content-Range header ServeContent set ("bytes */SIZE") is kept.
type rangeProblemWriter struct {
	http.ResponseWriter
	rangeHdr string // the request's Range
	name     string // the artifact
	size     int64
	replaced bool // the 416 was answered: ServeContent's own body is dropped
}

func (w *rangeProblemWriter) WriteHeader(code int) {
	if code != http.StatusRequestedRangeNotSatisfiable || w.replaced {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.replaced = true
	h := w.Header()
	for _, k := range []string{"ETag", "Content-Disposition"} {
		h.Del(k)
	}
	p := newProblem(http.StatusRequestedRangeNotSatisfiable, job.ProblemInvalidParameter, "Range not satisfiable",
		fmt.Sprintf("Range %q does not select bytes of artifact %q, which has %d bytes: ask for bytes=FIRST-LAST within 0-%d, or send no Range",
			w.rangeHdr, w.name, w.size, max(w.size-1, 0)))
	p.Field = "Range"
	writeProblem(w.ResponseWriter, p)
}

func (w *rangeProblemWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *rangeProblemWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
