package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
	ktrace "github.com/kilnrun/kiln/trace"
)

// argumentsMember is where a format's call carries its input as a JSON
// string, as a problem's field prefix ("" when it is an object).
func argumentsMember(f tooluse.Format) string {
	switch f {
	case tooluse.OpenAI:
		return "function.arguments."
	case tooluse.OpenAIResponses:
		return "arguments."
	}
	return ""
}

// outcomeResult returns the Result of a submission answered at once (a
// cache hit or a finished coalesced job) and whether there was one.
func answerResult(o answer) (job.Result, bool) {
	if rv, ok := o.body.(*resultView); ok && o.done {
		return rv.Result, true
	}
	return job.Result{}, false
}

// capWriter is an in-process http.ResponseWriter keeping at most limit
// bytes of the body.
type capWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	limit  int
	over   bool
}

func (w *capWriter) Header() http.Header { return w.header }

func (w *capWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *capWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.body.Len()+len(b) > w.limit {
		w.over = true
		return len(b), nil // drained, not kept
	}
	return w.body.Write(b)
}

// inputMessage words an invalid spec for the model, in terms of the tool's
// inputs (timeout_s rather than limits.timeout_ms).
func inputMessage(err error) string {
	var ie *job.InvalidError
	if !errors.As(err, &ie) {
		return err.Error()
	}
	if ie.Field == "limits.timeout_ms" {
		return "timeout_s is out of range: " + ie.Message + " (milliseconds)"
	}
	return ie.Field + ": " + ie.Message
}

// formatSeconds renders a limit in milliseconds as seconds ("300").
func formatSeconds(ms int64) string {
	if ms <= 0 {
		return ""
	}
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
}

// bodyHash is the Idempotency-Key fingerprint of a request body.
func bodyHash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// toolRoutes answer an agent's tool calls (POST /v1/tool-calls), run as
// submissions or as session calls, and describe what can be run: the tool
// definitions (tools.go) and the runtimes.
type toolRoutes struct {
	cfg         *Config
	submissions *submissions
	sessions    *sessions
	runtimes    *registry
	results     *resultWriter
	waits       *waits
	problems    *problems
	tracer      trace.Tracer
	prop        propagation.TextMapPropagator
	log         *slog.Logger
	// api is the API's own handler: images are read through its artifact
	// route, with the caller's credentials (inlineImages).
	api http.Handler
}

// handleToolCall answers POST /v1/tool-calls: a model's tool-use block in
// any format (Anthropic, OpenAI Chat Completions or Responses) is run
// through the normal submit path (same validation, result cache, coalescing
// and caller scope) and answered, once the job ends, with the matching
// tool-result block.
//
// A mistake of the model (unknown tool, bad input, an invalid spec) is
// answered 200 with a failed tool result the model can act on; a mistake of
// the caller (not a tool call) is a 400/422 problem, and a fault of the
// service (queue full, Redis down) the usual 429/503 for the caller to retry.
func (tr *toolRoutes) handleToolCall(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := tr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := tr.tracer.Start(ctx, ktrace.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > maxIdempotencyKey {
		p := badParam("Idempotency-Key", fmt.Sprintf("the Idempotency-Key header is %d bytes; the maximum is %d", len(idem), maxIdempotencyKey))
		fail(w, span, p)
		return
	}
	body, p := readBody(w, r, tr.cfg.MaxBodyBytes)
	if p != nil {
		fail(w, span, p)
		return
	}
	if p := decodeChecked(body, new(map[string]any), nil, ""); p != nil {
		fail(w, span, p) // not one JSON object
		return
	}
	if p := checkToolCallNames(body); p != nil {
		fail(w, span, p)
		return
	}
	call, err := tooluse.DecodeCall(body)
	if err != nil {
		var ce *tooluse.CallError
		errors.As(err, &ce)
		p := newProblem(http.StatusUnprocessableEntity, job.ProblemInvalidField, "Not a tool call", err.Error())
		if ce != nil {
			p.Field = ce.Field
		}
		fail(w, span, p)
		return
	}
	// OpenAI's arguments are a JSON string the envelope's scan did not read.
	if where := argumentsMember(call.Format); where != "" && call.InputErr == nil {
		if p := checkToolArgumentNames(call.Input, where); p != nil {
			fail(w, span, p)
			return
		}
	}
	span.SetAttributes(attribute.String("kiln.tool.format", string(call.Format)), attribute.String("kiln.tool.name", call.Name))
	if sid := r.Header.Get(HeaderSessionID); sid != "" {
		out, sid, p := tr.sessionToolCall(ctx, call, caller, sid, idem, r.URL.Query().Get("budget"), tr.waitBudget(w))
		if sid != "" {
			w.Header().Set(HeaderSessionID, sid)
		}
		if p != nil {
			fail(w, span, p)
			return
		}
		writeJSON(w, http.StatusOK, call.Block(out))
		return
	}
	// ?budget= names the caller's execution budget (budgets.go): the agent
	// harness sets it, the model never sees it.
	out, jobID, p := tr.runToolCall(ctx, call, caller, idem, body, tr.waitBudget(w), r.URL.Query().Get("budget"))
	if p != nil {
		fail(w, span, p)
		return
	}
	if call.Format != tooluse.OpenAI && len(out.Artifacts) > 0 {
		// A Chat Completions tool message takes text only: its text links them.
		out.Images = append(out.Images, tr.inlineImages(r, jobID, out.Artifacts)...)
	}
	if jobID != "" {
		w.Header().Set(job.HeaderJobID, jobID)
	}
	writeJSON(w, http.StatusOK, call.Block(out))
}

// runToolCall runs one call and returns its reply and job id, or the
// problem to answer instead.
func (tr *toolRoutes) runToolCall(ctx context.Context, call tooluse.Call, caller, idem string, body []byte,
	budget func(time.Duration) time.Duration, budgetID string) (tooluse.Reply, string, *problem) {
	if call.InputErr != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, call.InputErr.Error()), "", nil
	}
	snap, err := tr.runtimes.current(ctx)
	if err != nil {
		return tooluse.Reply{}, "", tr.problems.storeProblem(ctx, "list runtimes", err)
	}
	def, err := tooluse.Lookup(tooluse.Definitions(snap.list), call.Name)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, err.Error()), "", nil
	}
	in, err := tooluse.DecodeInput(call.Input)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, err.Error()), "", nil
	}
	rt := snap.byName[def.Runtime]
	spec := in.Spec(def.Runtime)
	spec.Budget = budgetID
	opts := submitOptions{idemKey: idem, waiter: &doneWaiter{}}
	defer opts.waiter.close()
	if idem != "" {
		opts.bodyHash = bodyHash(body)
	}
	limits, err := rt.Limits.Resolve(spec.Limits)
	if err != nil {
		return tooluse.Failed(job.CategoryInvalidRequest, inputMessage(err)), "", nil
	}
	o, err := tr.submissions.submit(ctx, caller, spec, opts)
	if err != nil {
		var ie *job.InvalidError
		if errors.As(err, &ie) {
			return tooluse.Failed(job.CategoryInvalidRequest, inputMessage(err)), "", nil
		}
		return tooluse.Reply{}, "", tr.problems.toProblem(ctx, "submit tool call", err)
	}
	res, done := answerResult(o)
	if !done {
		wait := budget(limits.Timeout() + tr.cfg.ToolCallQueueSlack)
		rec, err := tr.waits.awaitSubmitted(ctx, opts.waiter, caller, o.id, wait)
		if err != nil && !errors.Is(err, cache.ErrNotFound) {
			return tooluse.Reply{}, "", tr.problems.storeProblem(ctx, "wait for tool call", err)
		}
		if err != nil || !rec.Status.Terminal() || rec.Result == nil {
			st := rec.Status
			if st == "" {
				st = job.StatusQueued
			}
			return tooluse.Unfinished(o.id, st, wait.String()), o.id, nil
		}
		body, _ := recordView(&rec)
		res = body.(*resultView).Result
	}
	// The model reads the whole output (bounded by the job's output limit).
	if err := tr.results.loadOutput(ctx, &res); err != nil {
		return tooluse.Reply{}, o.id, tr.results.outputProblem(ctx, o.id, err)
	}
	return tooluse.Render(res, formatSeconds(rt.Limits.Max.TimeoutMS)), o.id, nil
}

// waitBudget returns how long a tool call answered on w may wait: as long
// as it wants, with the connection's write deadline moved past that (a
// server's WriteTimeout is sized for MaxWait long-polls, shorter than a long
// job), or MaxWait where the deadline cannot be moved.
func (tr *toolRoutes) waitBudget(w http.ResponseWriter) func(time.Duration) time.Duration {
	return func(want time.Duration) time.Duration {
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(want + 10*time.Second)); err != nil {
			return min(want, tr.cfg.MaxWait)
		}
		return want
	}
}

// inlineImages reads the image artifacts a model is shown inline. They are
// read through the API's own artifact route, with the caller's credentials,
// so that route's authorization and tenancy apply; one that cannot be read
// (or a server without the route) leaves it a link. The type the route
// serves (sniffed from the content) decides: a file named .png that is not
// an image is not sent to the model as one.
func (tr *toolRoutes) inlineImages(r *http.Request, jobID string, refs []tooluse.ArtifactRef) []tooluse.Image {
	var imgs []tooluse.Image
	for _, a := range refs {
		if !tooluse.Inline(a.MediaType, 1) {
			continue
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, a.Path, nil)
		if err != nil {
			continue
		}
		req.Header.Set("Authorization", r.Header.Get("Authorization"))
		w := &capWriter{header: http.Header{}, limit: tooluse.MaxInlineImageBytes}
		tr.api.ServeHTTP(w, req)
		served, _, _ := mime.ParseMediaType(w.header.Get("Content-Type"))
		if w.status != http.StatusOK || w.over || !tooluse.Inline(served, w.body.Len()) {
			tr.log.DebugContext(r.Context(), "artifact not inlined", slog.String("job_id", jobID), slog.String("artifact", a.Name),
				slog.Int("status", w.status), slog.Bool("too_large", w.over), slog.String("content_type", served))
			continue
		}
		imgs = append(imgs, tooluse.Image{Name: a.Name, MediaType: served, Data: w.body.Bytes(), Where: "GET " + a.Path})
	}
	return imgs
}
