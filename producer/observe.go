package producer

import (
	"net/http"
	"strings"
	"time"
)

// observe counts every answered request and its latency by route pattern,
// method and status (429 and 503 also as rejections), when metrics are on.
func (s *Server) observe(next http.Handler) http.Handler {
	if s.metrics == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		// The mux sets r.Pattern ("GET /v1/jobs/{id}"; "/" for a path of
		// no route): the label is its path, the method has its own.
		_, route, ok := strings.Cut(r.Pattern, " ")
		if !ok {
			route = r.Pattern
		}
		if route == "" || route == "/" {
			route = "unmatched"
		}
		s.metrics.HTTPRequest(r.Context(), route, r.Method, sw.status, time.Since(start))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (flushes
// and deadlines of long-polls).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
