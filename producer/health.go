package producer

import (
	"context"
	_ "embed"
	"net/http"
	"time"

	"github.com/kilnrun/kiln/job"
)

// openAPI is the API's OpenAPI 3.1 description, served at /openapi.json.
//
//go:embed openapi.json
var openAPI []byte

func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}

// handleHealthz says the process is up; it checks nothing else.
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadyz says whether the API can take jobs: Redis answers PING, the
// NATS connection is up, the job stream is set up and JetStream's store takes
// writes. A 503 names the failing dependency.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	checks := map[string]string{"redis": "ok", "nats": "ok"}
	ready := true
	if err := s.store.Ping(ctx); err != nil {
		checks["redis"] = "unavailable: " + err.Error()
		ready = false
	}
	if !s.nc.IsConnected() {
		checks["nats"] = "unavailable: connection is " + s.nc.Status().String()
		ready = false
	}
	if checks["queue"] = s.queue.queueCheck(); checks["queue"] != "ok" {
		ready = false
	}
	if checks["jetstream_store"] = s.writeCheck(); checks["jetstream_store"] != "ok" {
		ready = false
	}
	if checks["object_store"] = s.blobCheck(); checks["object_store"] != "ok" {
		ready = false
	}
	if !ready {
		p := newProblem(http.StatusServiceUnavailable, job.ProblemUnavailable, "Not ready", "a dependency is unavailable: see checks")
		if checks["redis"] != "ok" && checks["nats"] != "ok" {
			p.Detail = "Redis and NATS are unavailable: see checks"
		} else if checks["redis"] != "ok" {
			p.Detail = "Redis is unavailable: see checks"
		} else if checks["nats"] != "ok" {
			p.Detail = "NATS is unavailable: see checks"
		} else if checks["queue"] != "ok" {
			p.Detail = "the job stream is not set up yet: see checks"
		} else if checks["jetstream_store"] != "ok" {
			p.Detail = "JetStream's store does not take writes: see checks"
		} else {
			p.Detail = "the object store does not take writes: see checks"
		}
		p.Checks = checks
		p.retryAfter = s.cfg.RetryAfter
		writeProblem(w, p)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}

// handleRuntimes answers GET /v1/runtimes with the registered runtimes and
// the limits policy that applies to each.
func (s *Server) handleRuntimes(w http.ResponseWriter, r *http.Request, _ string) {
	snap, err := s.runtimes.current(r.Context())
	if err != nil {
		writeProblem(w, s.problems.storeProblem(r.Context(), "list runtimes", err))
		return
	}
	list := snap.list
	if list == nil {
		list = []job.RuntimeInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"runtimes": list})
}
