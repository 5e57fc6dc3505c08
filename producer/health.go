package producer

import (
	"context"
	_ "embed"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/job"
)

// openAPI is the API's OpenAPI 3.1 description, served at /openapi.json.
//
//go:embed openapi.json
var openAPI []byte

// healthRoutes answer the routes of the API itself: its description,
// liveness and readiness.
type healthRoutes struct {
	store  Store
	nc     *nats.Conn
	queue  *jobQueue
	probes *storeProbes
	cfg    *Config // RetryAfter
}

func (h *healthRoutes) handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}

// handleHealthz says the process is up; it checks nothing else.
func (h *healthRoutes) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadyz says whether the API can take jobs: Redis answers PING, the
// NATS connection is up, the job stream is set up and JetStream's store takes
// writes. A 503 names the failing dependency.
func (h *healthRoutes) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	checks := map[string]string{"redis": "ok", "nats": "ok"}
	ready := true
	if err := h.store.Ping(ctx); err != nil {
		checks["redis"] = "unavailable: " + err.Error()
		ready = false
	}
	if !h.nc.IsConnected() {
		checks["nats"] = "unavailable: connection is " + h.nc.Status().String()
		ready = false
	}
	if checks["queue"] = h.queue.queueCheck(); checks["queue"] != "ok" {
		ready = false
	}
	if checks["jetstream_store"] = h.probes.writeCheck(); checks["jetstream_store"] != "ok" {
		ready = false
	}
	if checks["object_store"] = h.probes.blobCheck(); checks["object_store"] != "ok" {
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
		p.retryAfter = h.cfg.RetryAfter
		writeProblem(w, p)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}
