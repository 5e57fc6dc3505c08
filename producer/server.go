package producer

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// instrumentationName names the tracer of this package.
const instrumentationName = "github.com/kilnrun/kiln/producer"

// Server is the HTTP API. Create it with New; it is safe for concurrent use.
// It wires the API's parts together and owns their background loops: each
// part is a type that owns its own state (the job queue, the audit log,
// sessions, ...), and each group of routes a route type holding the parts
// it uses (routes).
type Server struct {
	cfg      Config
	store    Store
	nc       *nats.Conn
	js       jetstream.JetStream
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	log      *slog.Logger
	metrics  *ktrace.Metrics
	blobs    *blob.Store // artifacts and inputs sent by reference
	runtimes *registry
	keys     apiKeys
	handler  http.Handler
	surfaces surfaces // other wire formats on this address (surface.go)

	problems    *problems      // the one mapping of errors to problems (problem.go)
	bodies      *bodyBudget    // request bodies held at once (bodybudget.go)
	tmetrics    *tenantMetrics // counts per tenant (tenant.go)
	tenants     *tenants       // each tenant's settings applied (tenant.go)
	queue       *jobQueue      // the job stream: set-up, publishing, gauges (publish.go)
	probes      *storeProbes   // whether the stores take writes (writeprobe.go)
	audit       *auditLog      // tenants' audit logs (audit.go)
	budgets     *budgets       // execution budgets (budgets.go)
	waits       *waits         // long-polls (wait.go)
	results     *resultWriter  // Results with output from the object store (resultwrite.go)
	events      *eventStreams  // live events over SSE (events.go)
	submissions *submissions   // a submission's domain steps (submission.go)
	sessions    *sessions      // sessions and their calls (sessions.go)

	// bg owns the Server's background loops (stream set-up, queue gauges,
	// store probes, the audit queue); they end with New's ctx or Close,
	// which waits for them.
	bg     errgroup.Group
	stopBG context.CancelFunc
}

// New validates cfg, creates or updates the KILN_JOBS stream, and returns a
// Server ready to serve Handler. When NATS is not reachable yet, the stream
// is set up in the background once it is (stream.go) and /readyz says so.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	js := cfg.JetStream
	if js == nil {
		var err error
		if js, err = jetstream.New(cfg.NATS); err != nil {
			return nil, fmt.Errorf("producer: jetstream: %w", err)
		}
	}
	s := &Server{
		blobs:    blob.New(js, cfg.Blob),
		cfg:      cfg,
		store:    cfg.Store,
		nc:       cfg.NATS,
		js:       js,
		tracer:   cfg.TracerProvider.Tracer(instrumentationName),
		prop:     cfg.Propagator,
		log:      cfg.Logger,
		metrics:  cfg.Metrics,
		runtimes: newRegistry(cfg.Store, cfg.RuntimeCacheTTL, cfg.Policy, cfg.Now),
		problems: &problems{log: cfg.Logger, retryAfter: cfg.RetryAfter, queueFullRetryAfter: cfg.QueueFullRetryAfter},
		tmetrics: &tenantMetrics{m: cfg.TenantMetrics, names: metricTenants(cfg)},
	}
	s.queue = &jobQueue{cfg: &s.cfg, store: cfg.Store, nc: cfg.NATS, js: js, blobs: s.blobs, prop: cfg.Propagator,
		log: cfg.Logger, metrics: cfg.Metrics, bg: &s.bg}
	s.tenants = &tenants{cfg: &s.cfg, store: cfg.Store, queue: s.queue, tmetrics: s.tmetrics}
	s.audit = newAuditLog(cfg, js, s.runtimes, s.problems)
	s.budgets = &budgets{store: cfg.Store, cfg: &s.cfg, audit: s.audit, problems: s.problems, log: cfg.Logger}
	s.probes = &storeProbes{cfg: &s.cfg, js: js, blobs: s.blobs, queue: s.queue, log: cfg.Logger}
	s.results = &resultWriter{blobs: s.blobs, cfg: &s.cfg, problems: s.problems, log: cfg.Logger}
	s.waits = newWaits(&s.cfg, cfg.NATS, js)
	s.events = &eventStreams{cfg: &s.cfg, store: cfg.Store, js: js, nc: cfg.NATS, streams: newStreamGate(),
		results: s.results, waits: s.waits, problems: s.problems, tmetrics: s.tmetrics, log: cfg.Logger}
	s.submissions = &submissions{cfg: &s.cfg, store: cfg.Store, blobs: s.blobs, runtimes: s.runtimes, tenants: s.tenants, budgets: s.budgets,
		queue: s.queue, events: s.events, waits: s.waits, audit: s.audit, tracer: s.tracer, metrics: cfg.Metrics, tmetrics: s.tmetrics, log: cfg.Logger}
	s.sessions = &sessions{cfg: &s.cfg, store: cfg.Store, nc: cfg.NATS, runtimes: s.runtimes, tenants: s.tenants, budgets: s.budgets,
		audit: s.audit, waits: s.waits, events: s.events, problems: s.problems, tracer: s.tracer, prop: s.prop, log: cfg.Logger}
	s.bodies = newBodyBudget(cfg)
	warnStoredBounds(ctx, s.log, cfg)
	s.keys = newAPIKeys(cfg.APIKeys)
	if len(s.keys) == 0 {
		s.log.WarnContext(ctx, "API AUTHENTICATION IS OFF (dev mode): no API keys are configured, so anyone who can reach this address can run code; configure API keys before exposing it")
	} else {
		s.log.InfoContext(ctx, "API keys loaded", slog.Int("keys", len(s.keys)))
	}
	s.handler = s.observe(withSurfaces(s, s.routes()))
	bgCtx, stopBG := context.WithCancel(ctx)
	s.stopBG = stopBG
	s.queue.setUpStream(bgCtx)
	s.queue.pollQueueDepth(bgCtx)
	if s.queue.queueCheck() == "ok" {
		// Ready at once when the store takes writes; the loop goes on.
		s.probes.recordWrite(ctx, s.probes.writeProbe(ctx))
		s.probes.recordBlobWrite(ctx, s.probes.blobProbe(ctx))
	}
	s.bg.Go(func() error { s.probes.probeWrites(bgCtx); return nil })
	s.bg.Go(func() error { s.audit.drainAudit(bgCtx); return nil })
	return s, nil
}

// Close stops the Server's background loops and returns once they have
// ended. It does not close the Store or the NATS connection (the caller's).
// Calling it again is harmless.
func (s *Server) Close() {
	s.stopBG()
	_ = s.bg.Wait()
}

// StopLongPolls makes every long-poll in progress, and any started later,
// answer at once with the job's current state. Call it when shutting down
// (http.Server.RegisterOnShutdown) so open waits do not delay the exit.
func (s *Server) StopLongPolls() { s.waits.stop() }

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// routes maps the API's routes to their route types: each group of
// routes holds the collaborators it uses.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	sessions := sessionRoutes{s.sessions}
	calls, commands, files := callRoutes{s.sessions}, commandRoutes{s.sessions}, fileRoutes{s.sessions, s.blobs}
	health := &healthRoutes{store: s.store, nc: s.nc, queue: s.queue, probes: s.probes, cfg: &s.cfg}
	ui := &uiRoutes{keys: s.keys, cfg: &s.cfg, store: s.store, blobs: s.blobs, sessions: s.sessions, results: s.results,
		problems: s.problems, log: s.log}
	jobs := &jobRoutes{cfg: &s.cfg, store: s.store, nc: s.nc, blobs: s.blobs, bodies: s.bodies, submissions: s.submissions,
		runtimes: s.runtimes, budgets: s.budgets, audit: s.audit, waits: s.waits, results: s.results, problems: s.problems,
		tracer: s.tracer, prop: s.prop, metrics: s.metrics, log: s.log}
	tools := &toolRoutes{cfg: &s.cfg, submissions: s.submissions, sessions: s.sessions, runtimes: s.runtimes, results: s.results,
		waits: s.waits, problems: s.problems, tracer: s.tracer, prop: s.prop, log: s.log,
		api: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) })}
	mux.HandleFunc("POST /v1/jobs", s.keys.authed(jobs.handleSubmit))
	mux.HandleFunc("POST /v1/jobs/batch", s.keys.authed(jobs.handleBatch))
	mux.HandleFunc("GET /v1/jobs", s.keys.authed(jobs.handleList))
	mux.HandleFunc("GET /v1/jobs/{id}", s.keys.authed(jobs.handleGet))
	mux.HandleFunc("DELETE /v1/jobs/{id}", s.keys.authed(jobs.handleCancel))
	mux.HandleFunc("POST /v1/jobs/{id}/replay", s.keys.authed(jobs.handleReplay))
	mux.HandleFunc("GET /v1/jobs/{id}/artifacts/{name...}", s.keys.authed(jobs.handleArtifact))
	mux.HandleFunc("GET /v1/jobs/{id}/events", s.keys.authed(s.events.handleEvents))
	mux.HandleFunc("GET /v1/runtimes", s.keys.authed(tools.handleRuntimes))
	mux.HandleFunc("POST /v1/sessions", s.keys.authed(sessions.handleSessionCreate))
	mux.HandleFunc("GET /v1/sessions", s.keys.authed(sessions.handleSessionList))
	mux.HandleFunc("GET /v1/sessions/{id}", s.keys.authed(sessions.handleSessionGet))
	mux.HandleFunc("DELETE /v1/sessions/{id}", s.keys.authed(sessions.handleSessionDelete))
	mux.HandleFunc("POST /v1/sessions/{id}/exec", s.keys.authed(sessions.handleSessionExec))
	mux.HandleFunc("POST /v1/sessions/{id}/pause", s.keys.authed(sessions.handleSessionPause))
	mux.HandleFunc("POST /v1/sessions/{id}/resume", s.keys.authed(sessions.handleSessionResume))
	mux.HandleFunc("GET /v1/sessions/{id}/calls/{seq}", s.keys.authed(calls.handleSessionCall))
	mux.HandleFunc("GET /v1/sessions/{id}/calls/{seq}/events", s.keys.authed(sessions.handleSessionCallEvents))
	mux.HandleFunc("POST /v1/sessions/{id}/calls/{seq}/cancel", s.keys.authed(calls.handleSessionCallCancel))
	mux.HandleFunc("POST /v1/sessions/{id}/commands", s.keys.authed(commands.handleSessionCommand))
	mux.HandleFunc("GET /v1/sessions/{id}/commands", s.keys.authed(commands.handleSessionCommandList))
	mux.HandleFunc("GET /v1/sessions/{id}/commands/{cid}", s.keys.authed(commands.handleSessionCommandGet))
	mux.HandleFunc("POST /v1/sessions/{id}/commands/{cid}/kill", s.keys.authed(commands.handleSessionCommandKill))
	mux.HandleFunc("POST /v1/sessions/{id}/commands/{cid}/stdin", s.keys.authed(commands.handleSessionCommandStdin))
	mux.HandleFunc("GET /v1/sessions/{id}/files", s.keys.authed(files.handleSessionFileList))
	mux.HandleFunc("POST /v1/sessions/{id}/files", s.keys.authed(files.handleSessionFileOp))
	mux.HandleFunc("GET /v1/sessions/{id}/files/{path...}", s.keys.authed(files.handleSessionFileGet))
	mux.HandleFunc("PUT /v1/sessions/{id}/files/{path...}", s.keys.authed(files.handleSessionFilePut))
	mux.HandleFunc("DELETE /v1/sessions/{id}/files/{path...}", s.keys.authed(files.handleSessionFileDelete))
	mux.HandleFunc("GET /v1/tools", s.keys.authed(tools.handleTools))
	mux.HandleFunc("POST /v1/tool-calls", s.keys.authed(tools.handleToolCall))
	mux.HandleFunc("POST /v1/budgets", s.keys.authed(s.budgets.handleCreateBudget))
	mux.HandleFunc("GET /v1/audit", s.keys.authed(s.audit.handleAudit))
	mux.HandleFunc("GET /v1/budgets/{id}", s.keys.authed(s.budgets.handleGetBudget))
	mux.HandleFunc("GET /healthz", health.handleHealthz)
	mux.HandleFunc("GET /readyz", health.handleReadyz)
	mux.HandleFunc("GET /openapi.json", health.handleOpenAPI)
	mux.HandleFunc("GET /ui/jobs/{id}", ui.uiAuthed(ui.handleUIJob))
	mux.HandleFunc("GET /ui/sessions/{id}", ui.uiAuthed(ui.handleUISession))
	mux.HandleFunc("GET /ui/login", ui.handleUILogin)
	mux.HandleFunc("POST /ui/login", ui.handleUILoginPost)
	mux.HandleFunc("GET /ui/assets/{name}", ui.handleUIAsset)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { handleNoRoute(mux, w, r) })
	return mux
}

// handleNoRoute answers 405 with Allow when the path exists for another
// method, else 404, both as problem documents.
func handleNoRoute(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pattern := mux.Handler(r2); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeProblem(w, newProblem(http.StatusMethodNotAllowed, job.ProblemMethodNotAllowed, "Method not allowed",
			fmt.Sprintf("%s is not supported on %s; use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))))
		return
	}
	writeProblem(w, newProblem(http.StatusNotFound, job.ProblemNotFound, "No such endpoint",
		fmt.Sprintf("%s %s is not an endpoint of this API; see /openapi.json", r.Method, r.URL.Path)))
}
