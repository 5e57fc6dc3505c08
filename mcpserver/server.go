package mcpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// QueueSlackDefault is Config.QueueSlack's default.
const QueueSlackDefault = 30 * time.Second

// ProgressIntervalDefault is Config.ProgressInterval's default: well within
// the official SDKs' 60 s request timeout.
const ProgressIntervalDefault = 5 * time.Second

// Config configures New. Zero fields take the default named beside them.
type Config struct {
	// BaseURL is the Kiln API, e.g. "http://127.0.0.1:8080". Required.
	BaseURL string
	// APIKey is sent as the bearer key. Default: none (a dev-mode API).
	APIKey string
	// HTTPClient makes the API calls. Default: a new http.Client.
	HTTPClient *http.Client
	// Version is reported to MCP clients. Default "dev".
	Version string
	// QueueSlack is how long a call waits for its job beyond the job's
	// wall-clock limit before answering that it has not finished. Default
	// QueueSlackDefault (30s).
	QueueSlack time.Duration
	// Budget, when set, is the execution budget (POST /v1/budgets) every
	// call's job names: the agent's cap on runs, CPU and wall time. The
	// model never sees it. Default: none.
	Budget string

	// ProgressInterval is how often a call whose request carries a progress
	// token is sent notifications/progress while its job runs (clients that
	// reset their timeout on progress then wait for any job). Default
	// ProgressIntervalDefault (5s).
	ProgressInterval time.Duration
	// Logger receives the server's log lines. Default: discard. Under stdio
	// it must not write to standard output, which carries the protocol.
	Logger *slog.Logger
	// Sessions runs each MCP session's calls in a Kiln session of its own
	// (sessions.go): variables, imports and files persist between its
	// calls. Default: off (every call in a fresh sandbox).
	Sessions bool
	// DisconnectGrace is how long a streamable HTTP session whose client
	// cut its stream and sent nothing more is kept before it is closed (and
	// its Kiln sessions with it). Default DisconnectGraceDefault (10s).
	DisconnectGrace time.Duration
}

// Server is an MCP server of Kiln's run tools.
type Server struct {
	cfg   Config
	api   *client.Client
	http  *http.Client
	log   *slog.Logger
	mcp   *mcp.Server
	calls calls
	posts posts

	sessions mcpSessions
	streams  httpSessions
}

// New connects to the API, reads its runtimes and returns a server with one
// run tool per runtime. When the API cannot be reached the python tool is
// offered with the default limits (its calls then report the API's error),
// so an MCP client still starts.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("mcpserver: BaseURL is required")
	}
	s := &Server{cfg: cfg, http: cmp.Or(cfg.HTTPClient, &http.Client{}), log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.cfg.QueueSlack = cmp.Or(cfg.QueueSlack, QueueSlackDefault)
	s.cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, ProgressIntervalDefault)
	s.streams = httpSessions{grace: cmp.Or(cfg.DisconnectGrace, DisconnectGraceDefault), gone: s.closeSession}
	opts := []client.Option{client.WithHTTPClient(s.http)}
	if cfg.APIKey != "" {
		opts = append(opts, client.WithAPIKey(cfg.APIKey))
	}
	var err error
	if s.api, err = client.New(cfg.BaseURL, opts...); err != nil {
		return nil, fmt.Errorf("mcpserver: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	runtimes, err := s.api.Runtimes(rctx)
	cancel()
	if err != nil || len(runtimes) == 0 {
		s.log.WarnContext(ctx, "could not read the API's runtimes; offering run_python with default limits",
			slog.String("server", cfg.BaseURL), slog.Any("error", err))
		runtimes = []job.RuntimeInfo{{Name: job.DefaultRuntime, Limits: job.DefaultPolicy()}}
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "kiln", Title: "Kiln sandboxed code runner", Version: cmp.Or(cfg.Version, "dev")},
		&mcp.ServerOptions{Logger: s.log, Instructions: "Run code in Kiln's isolated sandboxes: call run_<runtime> " +
			"with the program in code. Results give stdout, stderr, the exit code and, on failure, the error category " +
			"and whether changed code can help. Files the program writes to its output directory come back as " +
			"resources (" + artifactTemplate + ")."})
	for _, rt := range runtimes {
		def := tooluse.Define(rt)
		// Stateful only where the runtime has sessions: a runtime without
		// them is offered as jobs, each call fresh, and said so.
		stateful := cfg.Sessions && (rt.Sessions == nil || *rt.Sessions)
		if stateful {
			def = def.InSession()
		}
		s.mcp.AddTool(&mcp.Tool{Name: def.Name, Title: def.Title, Description: def.Description, InputSchema: def.InputSchema,
			Annotations: &mcp.ToolAnnotations{OpenWorldHint: new(false)}}, s.runTool(def, rt, stateful))
	}
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{Name: "artifact", Title: "Job artifact", URITemplate: artifactTemplate,
		Description: "A file a Kiln job left in its output directory."}, s.readArtifact)
	return s, nil
}

// MCP returns the underlying SDK server, to Run on a transport or serve
// with mcp.NewStreamableHTTPHandler.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// ServeStdio serves one client over t (stdin and stdout, for `kiln mcp`)
// until the client disconnects (closes its end) or ctx ends (the client
// stopped the process with a signal): both the normal end of a stdio
// server, answered nil without an error line, where the SDK's Run logs
// "server run cancelled" at ERROR. A broken connection is its error. Either
// way the session's Kiln sessions are closed before it returns (the process
// exits next).
func (s *Server) ServeStdio(ctx context.Context, t mcp.Transport) error {
	ss, err := s.mcp.Connect(ctx, t, nil)
	if err != nil {
		return fmt.Errorf("mcp: connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if err := s.Close(cctx); err != nil {
			s.log.WarnContext(ctx, "close the stdio session's Kiln sessions", slog.Any("error", err))
		}
	}()
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case <-ctx.Done():
		_ = ss.Close()
		<-ended
		s.log.DebugContext(ctx, "stdio session ended by a signal")
		return nil
	case err := <-ended:
		if err == nil || errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
			s.log.DebugContext(ctx, "stdio client disconnected")
			return nil
		}
		return fmt.Errorf("mcp: session: %w", err)
	}
}

// runTool runs one call of def, in the MCP session's Kiln session when
// stateful, else as a job, and answers with its result.
func (s *Server) runTool(def tooluse.Definition, rt job.RuntimeInfo, stateful bool) mcp.ToolHandler {
	maxTimeout := ""
	if rt.Limits.Max.TimeoutMS > 0 {
		maxTimeout = fmt.Sprint(float64(rt.Limits.Max.TimeoutMS) / 1000)
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancelCall := context.WithCancel(ctx)
		defer cancelCall()
		if req.Session != nil && req.Session.ID() != "" {
			defer s.calls.add(req.Session.ID(), cancelCall)()
		}
		if req.Extra != nil {
			defer s.posts.follow(req.Extra.Header.Get(postHeader), cancelCall)()
		}
		in, err := tooluse.DecodeInput(req.Params.Arguments)
		if err != nil {
			return s.result(ctx, tooluse.Failed(job.CategoryInvalidRequest, err.Error())), nil
		}
		if stateful && req.Session != nil {
			return s.runInSession(ctx, req.Session, def, in, maxTimeout)
		}
		spec := in.Spec(def.Runtime)
		spec.Budget = s.cfg.Budget
		timeout := time.Duration(cmp.Or(spec.Limits.TimeoutMS, rt.Limits.Default.TimeoutMS, job.DefaultLimits.TimeoutMS)) * time.Millisecond
		wait := timeout + s.cfg.QueueSlack
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		// Submitted without ?wait= so the id is known at once: a call the
		// client cancels while the job runs can then cancel the job. The
		// submission itself is not given up with the call (startContext).
		sctx, stopStart := startContext(ctx)
		sub, err := s.api.Submit(sctx, spec)
		stopStart()
		if err != nil {
			if ctx.Err() != nil {
				return nil, rpcError(ctx.Err())
			}
			return s.apiFailure(ctx, err), nil
		}
		v := sub.JobView
		if !v.Terminal() && ctx.Err() != nil {
			s.cancelJob(ctx, sub.ID) // canceled while it was being submitted
			return nil, rpcError(ctx.Err())
		}
		if !v.Terminal() {
			stop := s.reportProgress(ctx, req, sub.ID, timeout)
			v, err = s.api.Wait(wctx, sub.ID)
			stop()
			if err != nil {
				if ctx.Err() != nil {
					s.cancelJob(ctx, sub.ID) // the client gave up the call: nobody will read the result
					return nil, rpcError(ctx.Err())
				}
				if wctx.Err() != nil {
					return s.result(ctx, tooluse.Unfinished(sub.ID, sub.Status, wait.String())), nil
				}
				return s.apiFailure(ctx, err), nil
			}
		}
		return s.result(ctx, tooluse.Render(v.Result, maxTimeout)), nil
	}
}

// reportProgress sends notifications/progress for a call whose request
// carries a progress token, every ProgressInterval until stop is called:
// progress is the seconds waited so far, total the job's time limit plus
// the queueing allowed. A failed notification only costs the client's
// timer.
func (s *Server) reportProgress(ctx context.Context, req *mcp.CallToolRequest, jobID string, timeout time.Duration) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		tick := time.NewTicker(s.cfg.ProgressInterval)
		defer tick.Stop()
		total := (timeout + s.cfg.QueueSlack).Seconds()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				waited := time.Since(start).Seconds()
				err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
					Progress: waited, Total: total, Message: fmt.Sprintf("job %s: %.0f s", jobID, waited)})
				if err != nil {
					s.log.DebugContext(ctx, "progress notification", slog.String("job_id", jobID), slog.Any("error", err))
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// startContext is what a call's job or session call is submitted on: the
// call's values, but not its cancel, bounded by startTimeout. The API may
// have accepted the job by the time the call is canceled, and only the id
// its answer carries lets the job be canceled: a submission given up with
// the call would leave the job to run to its timeout for nobody.
func startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
}

// startTimeout bounds a submission (it answers at once: no ?wait=).
const startTimeout = 30 * time.Second

// cancelJob asks the API to cancel a job whose call was canceled, on a
// context of its own (the call's has ended).
func (s *Server) cancelJob(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.api.Cancel(cctx, id); err != nil {
		s.log.WarnContext(ctx, "cancel the job of a canceled call", slog.String("job_id", id), slog.Any("error", err))
	}
}

// apiFailure answers a call the API refused or could not take: a refused
// spec is the model's to fix; anything else is reported as is.
func (s *Server) apiFailure(ctx context.Context, err error) *mcp.CallToolResult {
	var ae *client.Error
	if errors.As(err, &ae) && ae.Status == http.StatusUnprocessableEntity {
		msg := ae.Detail
		if ae.Field != "" {
			msg = ae.Field + ": " + msg
		}
		return s.result(ctx, tooluse.Failed(job.CategoryInvalidRequest, msg))
	}
	if ae != nil && (strings.HasPrefix(ae.Type, job.ProblemQuotaPrefix) || ae.Type == string(job.ProblemBudgetExhausted)) {
		// A quota or a cap reached: not a fault, and the same call at once
		// does not help (a rate says after how long it does).
		return s.result(ctx, tooluse.QuotaRefused(ae.Type, ae.Detail, ae.RetryAfter))
	}
	if ae != nil && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden) {
		// Not the model's to fix, and no retry helps: the key is the user's.
		s.log.WarnContext(ctx, "kiln API refused the key", slog.Int("status", ae.Status), slog.Any("error", err))
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
			Text: "status: not run\nerror_category: unauthorized\nerror: the Kiln API refused this MCP server's API key (" + ae.Detail +
				")\nretry_with_changed_code_can_help: no\nretry_same_call_can_help: false\n" +
				"what_to_do: do not retry: the user must set a valid KILN_API_KEY for the Kiln MCP server\n"}}}
	}
	s.log.WarnContext(ctx, "kiln API call failed", slog.Any("error", err))
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
		Text: "status: not run\nerror_category: internal\nerror: " + err.Error() +
			"\nretry_with_changed_code_can_help: no\nretry_same_call_can_help: true\nwhat_to_do: the Kiln service could not run the call; make the same call again later\n"}}}
}

// result turns a reply into MCP content: the text, a resource link per
// artifact, and image artifacts inline when the API serves them as images.
func (s *Server) result(ctx context.Context, o tooluse.Reply) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: o.IsError, Content: []mcp.Content{&mcp.TextContent{Text: o.Text}}}
	for _, img := range o.Images { // the display outputs' images
		res.Content = append(res.Content, &mcp.ImageContent{Data: img.Data, MIMEType: img.MediaType})
	}
	for _, a := range o.Artifacts {
		uri := artifactURI(a)
		res.Content = append(res.Content, &mcp.ResourceLink{URI: uri, Name: a.Name, MIMEType: a.MediaType})
		if !tooluse.Inline(a.MediaType, 1) {
			continue
		}
		data, served, err := s.fetch(ctx, a.Path, tooluse.MaxInlineImageBytes)
		if err != nil || !tooluse.Inline(served, len(data)) { // the served type is sniffed from the content
			s.log.DebugContext(ctx, "artifact not inlined", slog.String("artifact", a.Path), slog.String("content_type", served), slog.Any("error", err))
			continue
		}
		res.Content = append(res.Content, &mcp.ImageContent{Data: data, MIMEType: served})
	}
	return res
}

// artifactTemplate is the URI template of artifact resources.
const artifactTemplate = "kiln://jobs/{id}/artifacts/{name}"

func artifactURI(a tooluse.ArtifactRef) string {
	return "kiln:/" + a.Path[len("/v1"):] // kiln://jobs/ID/artifacts/NAME, escaped as the route is
}

// rpcError is err as a JSON-RPC error with a valid code (a plain error
// goes out with code 0, which is none): internal error, the message kept.
func rpcError(err error) error {
	var we *jsonrpc.Error
	if errors.As(err, &we) && we.Code != 0 {
		return err
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

// readArtifact serves resources/read of kiln://jobs/{id}/artifacts/{name}
// from the API's artifact route.
func (s *Server) readArtifact(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, "kiln://jobs/")
	id, name, ok2 := strings.Cut(rest, "/artifacts/")
	if !ok || !ok2 || !job.ValidID(id) || name == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	data, ctype, err := s.fetch(ctx, "/v1/jobs/"+id+"/artifacts/"+name, maxResourceBytes)
	if err != nil {
		var nf *notFoundError
		if errors.As(err, &nf) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, rpcError(err)
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: ctype}
	// Text only when it is UTF-8: the sniffed text/plain also covers, say,
	// Latin-1, whose bytes a JSON string would replace.
	if (strings.HasPrefix(ctype, "text/") || ctype == "application/json") && utf8.Valid(data) {
		c.Text = string(data)
	} else {
		c.Blob = data
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}
