package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
)

// Ports E2B's SDKs name in E2b-Sandbox-Port.
const (
	portEnvd    = "49983"
	portJupyter = "49999"
)

// envdVersion is the envd version sandboxes report. The SDKs gate features
// on it; 0.1.0 is the lowest they accept, and claims nothing this package
// does not serve beyond what every envd has (files, commands: commands
// answer "not implemented").
const envdVersion = "0.1.0"

// Headers of E2B's data plane.
const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerAccessToken  = "X-Access-Token"
	headerTrafficToken = "E2B-Traffic-Access-Token"
	headerAPIKey       = "X-Api-Key"
)

// Domain is what the package calls: producer.Domain, a Server's session calls.
type Domain interface {
	Authenticate(ctx context.Context, key string) (context.Context, string, error)
	AuthenticateSession(ctx context.Context, id, token string) (context.Context, string, error)
	SessionToken(ctx context.Context, id string) string
	CreateSession(ctx context.Context, tenant string, spec job.SessionSpec) (job.Session, error)
	GetSession(ctx context.Context, tenant, id string) (job.Session, []job.SessionFileEntry, error)
	ListSessions(ctx context.Context, tenant string, tags job.Metadata) ([]job.Session, error)
	DeleteSession(ctx context.Context, tenant, id string) (job.Session, error)
	PauseSession(ctx context.Context, tenant, id string, wait time.Duration) (job.Session, bool, error)
	ResumeSession(ctx context.Context, tenant, id string) (job.Session, error)
	RunCall(ctx context.Context, tenant, id string, call job.SessionCall, wait time.Duration) (*job.CallResult, *job.CallPending, error)
	AwaitCall(ctx context.Context, tenant, id string, seq int64, wait time.Duration) (*job.CallResult, *job.CallPending, error)
	FollowCall(ctx context.Context, tenant, id string, seq int64, fn func(typ string, data []byte) error) (*job.CallResult, error)
	InterruptCall(ctx context.Context, tenant, id string, seq int64) error
	OpenSessionFile(ctx context.Context, tenant, id, name string) (io.ReadCloser, int64, error)
	MaxWait() time.Duration
}

var _ Domain = (*producer.Domain)(nil)

// Surface serves E2B's API; mount it with producer.Domain.Mount.
type Surface struct {
	d       Domain
	log     *slog.Logger
	ctxs    contexts
	control *http.ServeMux
	jupyter *http.ServeMux
	envd    *http.ServeMux
	// keepAlive is how often a running execution's stream carries a
	// keep-alive line.
	keepAlive time.Duration
}

// Option sets a Surface's optional settings.
type Option func(*Surface)

// WithKeepAlive sets how often a running execution's stream carries a
// keep-alive line (default 5 s, as E2B's code interpreter).
func WithKeepAlive(d time.Duration) Option { return func(s *Surface) { s.keepAlive = d } }

// New returns the Surface over d.
func New(d Domain, log *slog.Logger, opts ...Option) *Surface {
	s := &Surface{d: d, log: log, ctxs: contexts{d: d, log: log}, keepAlive: 5 * time.Second}
	for _, o := range opts {
		o(s)
	}
	s.control = http.NewServeMux()
	s.control.HandleFunc("POST /sandboxes", s.controlled(s.handleCreate))
	s.control.HandleFunc("POST /v2/sandboxes", s.controlled(s.handleCreate))
	s.control.HandleFunc("GET /sandboxes", s.controlled(s.handleListV1))
	s.control.HandleFunc("GET /v2/sandboxes", s.controlled(s.handleList))
	s.control.HandleFunc("GET /sandboxes/{id}", s.controlled(s.handleGet))
	s.control.HandleFunc("DELETE /sandboxes/{id}", s.controlled(s.handleKill))
	s.control.HandleFunc("POST /sandboxes/{id}/timeout", s.controlled(s.handleTimeout))
	s.control.HandleFunc("POST /sandboxes/{id}/connect", s.controlled(s.handleConnect))
	s.control.HandleFunc("POST /v2/sandboxes/{id}/connect", s.controlled(s.handleConnect))
	s.control.HandleFunc("POST /sandboxes/{id}/resume", s.controlled(s.handleConnect))
	s.control.HandleFunc("POST /sandboxes/{id}/pause", s.controlled(s.handlePause))
	s.control.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of the E2B API this server speaks (docs/e2b.md)", r.Method, r.URL.Path))
	})

	s.jupyter = http.NewServeMux()
	s.jupyter.HandleFunc("GET /health", handleHealth)
	s.jupyter.HandleFunc("POST /execute", s.sandboxed(s.handleExecute))
	s.jupyter.HandleFunc("GET /contexts", s.sandboxed(s.handleContexts))
	s.jupyter.HandleFunc("POST /contexts", s.sandboxed(s.handleContextCreate))
	s.jupyter.HandleFunc("DELETE /contexts/{ctx}", s.sandboxed(s.handleContextDelete))
	s.jupyter.HandleFunc("POST /contexts/{ctx}/restart", s.sandboxed(s.handleContextRestart))
	s.jupyter.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, http.StatusNotFound, fmt.Sprintf("%s %s is not served by this code interpreter (docs/e2b.md)", r.Method, r.URL.Path))
	})

	s.envd = http.NewServeMux()
	s.envd.HandleFunc("GET /health", s.handleEnvdHealth)
	s.envd.HandleFunc("GET /files", s.sandboxed(s.handleFileRead))
	s.envd.HandleFunc("POST /files", s.sandboxed(s.handleFileWrite))
	s.mountFilesystem(s.envd)
	processes{s: s}.mount(s.envd)
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not served by Kiln's envd yet (docs/e2b.md lists what is)", r.Method, r.URL.Path))
	})
	return s
}

// Match picks E2B's requests: those naming a sandbox in E2b-Sandbox-Id
// (the data plane), and the control plane's paths, which the native API
// (/v1/...) does not use.
func (s *Surface) Match(r *http.Request) bool {
	if r.Header.Get(headerSandboxID) != "" {
		return true
	}
	p := r.URL.Path
	return p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") || p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/")
}

func (s *Surface) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.ErrorContext(r.Context(), "e2b request panicked", slog.Any("panic", v), slog.String("path", r.URL.Path))
			writeError(w, http.StatusInternalServerError, "internal error")
		}
	}()
	if r.Header.Get(headerSandboxID) == "" {
		s.control.ServeHTTP(w, r)
		return
	}
	switch port := r.Header.Get(headerSandboxPort); port {
	case portJupyter:
		s.jupyter.ServeHTTP(w, r)
	case portEnvd, "":
		s.envd.ServeHTTP(w, r)
	default:
		writeError(w, http.StatusBadGateway, fmt.Sprintf("port %s of a sandbox is not reachable through Kiln: only envd (%s) and the code interpreter (%s) are", port, portEnvd, portJupyter))
	}
}

// controlled authenticates a control-plane request by its X-API-Key.
func (s *Surface) controlled(h func(w http.ResponseWriter, r *http.Request, tenant string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, tenant, err := s.d.Authenticate(r.Context(), r.Header.Get(headerAPIKey))
		if err != nil {
			s.writeDomainError(w, r, err)
			return
		}
		h(w, r.WithContext(ctx), tenant)
	}
}

// sandboxed authenticates a data-plane request by the sandbox's access
// token, and passes the sandbox id and its tenant.
func (s *Surface) sandboxed(h func(w http.ResponseWriter, r *http.Request, tenant, id string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, token := r.Header.Get(headerSandboxID), tokenOf(r)
		if token == "" {
			writeError(w, http.StatusUnauthorized, "this sandbox's access token is required (X-Access-Token): the SDK sends the one Sandbox.create or Sandbox.connect returned")
			return
		}
		ctx, tenant, err := s.d.AuthenticateSession(r.Context(), id, token)
		if err != nil {
			s.writeDomainError(w, r, err)
			return
		}
		h(w, r.WithContext(ctx), tenant, id)
	}
}

// tokenOf is the sandbox access token r carries: envd's header, or the
// code interpreter's traffic token.
func tokenOf(r *http.Request) string {
	if t := r.Header.Get(headerAccessToken); t != "" {
		return t
	}
	return r.Header.Get(headerTrafficToken)
}

func handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `"OK"`)
}

// handleEnvdHealth answers envd's health check, which the SDKs' isRunning
// reads: 204 while the sandbox lives, 502 (E2B's answer for a sandbox
// gone) once it has ended or for a sandbox this token does not reach.
func (s *Surface) handleEnvdHealth(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerSandboxID)
	ctx, tenant, err := s.d.AuthenticateSession(r.Context(), id, tokenOf(r))
	if err == nil {
		var v job.Session
		if v, _, err = s.d.GetSession(ctx, tenant, id); err == nil && v.Status != job.SessionEnded {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	if err != nil && domainStatus(err) != http.StatusNotFound {
		s.writeDomainError(w, r, err)
		return
	}
	writeError(w, http.StatusBadGateway, "sandbox "+id+" is not running")
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// writeDomainError answers a domain call's refusal as E2B's error body,
// with the status the native API gives it (and Retry-After where it says
// when to retry).
func (s *Surface) writeDomainError(w http.ResponseWriter, r *http.Request, err error) {
	status, title, detail, retry, ok := producer.ProblemOf(err)
	if !ok {
		s.log.ErrorContext(r.Context(), "e2b request failed", slog.String("path", r.URL.Path), slog.Any("err", err))
		writeError(w, http.StatusInternalServerError, "internal error")
		return
	}
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	}
	writeError(w, status, title+": "+detail)
}

// domainStatus is the HTTP status a domain call's refusal carries (500
// for an error that carries none).
func domainStatus(err error) int {
	if status, _, _, _, ok := producer.ProblemOf(err); ok {
		return status
	}
	return http.StatusInternalServerError
}

var errNoFile = errors.New("no such file")
