package worker

import (
	"encoding/json"
	"net/http"
)

// HealthHandler serves a standalone worker's probes:
//
//   - GET /healthz: 200 while the process is up; it checks nothing else.
//   - GET /readyz: 200 {"status":"ready","checks":{...}} when the worker
//     can take jobs (Readiness), else 503 application/problem+json whose
//     "checks" name each dependency's state ("ok" or what is wrong).
func (w *Worker) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		writeHealth(rw, http.StatusOK, "application/json", map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		ready, checks := w.Readiness(r.Context())
		if ready {
			writeHealth(rw, http.StatusOK, "application/json", map[string]any{"status": "ready", "checks": checks})
			return
		}
		writeHealth(rw, http.StatusServiceUnavailable, "application/problem+json", map[string]any{
			"type": "about:blank", "title": "Not ready", "status": http.StatusServiceUnavailable,
			"detail": "the worker cannot take jobs: see checks", "checks": checks,
		})
	})
	return mux
}

func writeHealth(rw http.ResponseWriter, code int, contentType string, body any) {
	rw.Header().Set("Content-Type", contentType)
	rw.Header().Set("Cache-Control", "no-store")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(body)
}
