package e2bapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// The code interpreter (E2b-Sandbox-Port 49999): POST /execute runs code
// as a call of the sandbox's session and streams what it made as E2B's
// newline-delimited JSON.

// defaultContext is a sandbox's own code context: its session's python
// interpreter (contexts.go has the others). Its working directory is
// Kiln's /work, which E2B's paths name /home/user.
const (
	defaultContext = "kiln-python"
	homeDir        = "/home/user"
)

// executeBody is POST /execute's body.
type executeBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// mimeKeys maps a display output's MIME types to the keys of E2B's result.
var mimeKeys = map[string]string{
	job.MIMEText: "text", job.MIMEHTML: "html", job.MIMEMarkdown: "markdown", job.MIMESVG: "svg", job.MIMEPNG: "png",
	job.MIMEJPEG: "jpeg", "application/pdf": "pdf", "text/latex": "latex", job.MIMEJSON: "json",
	"application/javascript": "javascript",
}

func (s *Surface) handleExecute(w http.ResponseWriter, r *http.Request, tenant, id string) {
	var body executeBody
	if err := json.NewDecoder(io.LimitReader(r.Body, job.MaxSpecJSONSize)).Decode(&body); err != nil {
		writeText(w, http.StatusBadRequest, "the body is not code to execute: "+err.Error())
		return
	}
	sbx, ok := s.session(w, r, tenant, id, true)
	if !ok {
		return
	}
	target, err := s.ctxs.target(r.Context(), tenant, sbx, body.ContextID, body.Language)
	if err != nil {
		writeDomainTextError(w, err)
		return
	}
	// The sandbox's envVars are its session's env, under the call's own.
	s.execute(w, r, tenant, target, job.SessionCall{Code: body.Code, Env: body.EnvVars})
}

// writeGrace bounds each write of an execution's stream; interruptGrace,
// the interrupt of an execution whose client went away.
const (
	writeGrace     = 30 * time.Second
	interruptGrace = 5 * time.Second
)

// followAfter is how long an execution waits for its call's result before
// it follows the call's events: the events' own flush interval, so a
// short call costs no reading of them and a long one's first output is
// no later for it.
const followAfter = 100 * time.Millisecond

// callOutcome is a call's result, or the refusal of it.
type callOutcome struct {
	res *job.CallResult
	err error
}

// execute runs call in session id and streams it: its stdout and stderr
// as the call prints them, then what it made. A refusal that comes before
// the stream has begun (its first output or keep-alive) is the answer's
// status; one after it is an error line. A client that goes away
// interrupts the call (runToEnd; docs/e2b.md).
func (s *Surface) execute(w http.ResponseWriter, r *http.Request, tenant, id string, call job.SessionCall) {
	ctx := r.Context()
	out := make(chan callOutcome, 1)
	evs := make(chan callEvent) // unbuffered: every event is written before the outcome is read
	go func() {
		defer func() {
			if v := recover(); v != nil {
				out <- callOutcome{err: fmt.Errorf("e2bapi: execute panicked: %v", v)}
			}
		}()
		out <- s.runToEnd(ctx, tenant, id, call, func(typ string, data []byte) error {
			select {
			case evs <- callEvent{typ: typ, data: data}:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	tick := time.NewTicker(s.keepAlive)
	defer tick.Stop()
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	start := func() {
		// A run may outlast the server's write timeout: each write has
		// writeGrace of its own, so only a client that stops reading ends it.
		_ = rc.SetWriteDeadline(time.Now().Add(writeGrace))
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
	}
	var sent streamed
	for {
		select {
		case ev := <-evs:
			line := sent.line(ev)
			if line == nil {
				continue
			}
			start()
			_ = enc.Encode(line)
			_ = rc.Flush()
		case o := <-out:
			if o.err != nil {
				if !started {
					writeDomainTextError(w, o.err)
					return
				}
				_ = enc.Encode(map[string]any{"type": "error", "name": "KilnError", "value": o.err.Error(), "traceback": ""})
				_ = enc.Encode(map[string]string{"type": "unexpected_end_of_execution"})
				return
			}
			start()
			for _, line := range executionLines(o.res, &sent) {
				_ = enc.Encode(line)
			}
			_ = rc.Flush()
			return
		case <-tick.C:
			start()
			_ = enc.Encode(map[string]string{"type": "keepalive"})
			_ = rc.Flush()
		case <-ctx.Done():
			return
		}
	}
}

// callEvent is an event of a running call (job.Event*).
type callEvent struct {
	typ  string
	data []byte
}

// streamed is the output of a call already sent as its stream's lines.
type streamed struct{ stdout, stderr strings.Builder }

// line is the stream line of an output event (nil for the others: a
// call's display outputs and error come with its result), and notes what
// it carried.
func (st *streamed) line(ev callEvent) map[string]any {
	if ev.typ != job.EventStdout && ev.typ != job.EventStderr {
		return nil
	}
	var o job.OutputEvent
	if json.Unmarshal(ev.data, &o) != nil {
		return nil
	}
	text := o.Data
	if o.DataBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(o.DataBase64)
		if err != nil {
			return nil
		}
		text = strings.ToValidUTF8(string(b), "\uFFFD")
	}
	if text == "" {
		return nil
	}
	if ev.typ == job.EventStdout {
		st.stdout.WriteString(text)
	} else {
		st.stderr.WriteString(text)
	}
	return map[string]any{"type": ev.typ, "text": text}
}

// rest is what a call's output holds past what was streamed of it: all of
// it when the stream carried something else (a chunk not valid UTF-8 that
// the result holds in another form).
func rest(all, sent string) string {
	if strings.HasPrefix(all, sent) {
		return all[len(sent):]
	}
	return all
}

// runToEnd runs call and returns its result once it has ended (a call
// longer than the API's longest wait is waited for again, as long as ctx
// lasts). With fn, the call is an execution: its events are passed to fn as
// they come, and a client that goes away (ctx ends) before it has ended
// interrupts it, as E2B's interpreter does.
func (s *Surface) runToEnd(ctx context.Context, tenant, id string, call job.SessionCall, fn func(typ string, data []byte) error) callOutcome {
	wait := s.d.MaxWait()
	if fn != nil {
		// A call over by then is answered whole, as its events would
		// be; a longer one is followed from its first event.
		wait = followAfter
	}
	res, pending, err := s.d.RunCall(ctx, tenant, id, call, wait)
	for err == nil && res == nil && pending != nil && ctx.Err() == nil {
		if fn != nil {
			res, err = s.d.FollowCall(ctx, tenant, id, pending.Seq, fn)
			break
		}
		res, pending, err = s.d.AwaitCall(ctx, tenant, id, pending.Seq, s.d.MaxWait())
	}
	if fn != nil && res == nil && pending != nil && ctx.Err() != nil {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptGrace)
		if err := s.d.InterruptCall(ictx, tenant, id, pending.Seq); err != nil {
			s.log.WarnContext(ctx, "e2b: interrupt the call of a client that went away", slog.String("session_id", id),
				slog.Int64("seq", pending.Seq), slog.Any("error", err))
		}
		cancel()
	}
	if err == nil && res == nil {
		if err = ctx.Err(); err == nil {
			err = errors.New("the API stopped before the call ended: read its result again")
		}
	}
	return callOutcome{res: res, err: err}
}

// writeDomainTextError answers err in plain text: a contextError's
// status, or the domain's.
func writeDomainTextError(w http.ResponseWriter, err error) {
	if ce := (*contextError)(nil); errors.As(err, &ce) {
		writeText(w, ce.status, ce.msg)
		return
	}
	writeText(w, domainStatus(err), err.Error())
}

// executionLines is a call's result as E2B's execution stream: what its
// output streams hold past what was sent of them, its display outputs (results), its error, the execution count,
// the end.
func executionLines(res *job.CallResult, sent *streamed) []map[string]any {
	var lines []map[string]any
	if t := rest(res.Stdout, sent.stdout.String()); t != "" {
		lines = append(lines, map[string]any{"type": "stdout", "text": t})
	}
	if t := rest(res.Stderr, sent.stderr.String()); t != "" {
		lines = append(lines, map[string]any{"type": "stderr", "text": t})
	}
	for _, o := range res.Outputs {
		lines = append(lines, resultLine(o))
	}
	if e := executionError(res); e != nil {
		lines = append(lines, e)
	}
	lines = append(lines, map[string]any{"type": "number_of_executions", "execution_count": res.Seq},
		map[string]any{"type": "end_of_execution"})
	return lines
}

// resultLine is a display output as E2B's result: each MIME type under
// E2B's key, the others in extra; is_main_result for the value of the
// last expression.
func resultLine(o job.Output) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": o.Type == job.OutputResult}
	extra := map[string]json.RawMessage{}
	for mime, raw := range o.Data {
		key, ok := mimeKeys[mime]
		if !ok {
			extra[mime] = raw
			continue
		}
		if key == "text" {
			// E2B's interpreter shows a string's repr without its quotes.
			var t string
			if json.Unmarshal(raw, &t) == nil && len(t) >= 2 && (t[0] == '\'' || t[0] == '"') && t[len(t)-1] == t[0] {
				raw, _ = json.Marshal(t[1 : len(t)-1])
			}
		}
		m[key] = raw
	}
	if len(extra) > 0 {
		m["extra"] = extra
	}
	return m
}

// executionError is the call's failure as E2B's error: an exception's
// class, message and traceback; any other failure (a limit, the sandbox)
// by its category and message.
func executionError(res *job.CallResult) map[string]any {
	f := res.Error
	if f == nil {
		return nil
	}
	if e := f.Exception; e != nil {
		return map[string]any{"type": "error", "name": e.Type, "value": e.Message, "traceback": traceback(e, res.Stderr)}
	}
	return map[string]any{"type": "error", "name": string(f.Category), "value": f.Message, "traceback": ""}
}

// traceback is an exception's traceback as Python prints it. A session
// call's own frames are not the exception's frames (its code is not a file
// of /work), but its interpreter printed them on stderr: the last
// traceback there that ends with this exception is taken; else one is
// made of the frames and the line the exception names.
func traceback(e *job.Exception, stderr string) string {
	const head = "Traceback (most recent call last):"
	last := e.Type
	if e.Message != "" {
		last += ": " + e.Message
	}
	if i := strings.LastIndex(stderr, head); i >= 0 && len(e.Frames) == 0 {
		if tb := strings.TrimRight(stderr[i:], "\n"); strings.HasSuffix(tb, last) {
			return tb
		}
	}
	var b strings.Builder
	if len(e.Frames) > 0 {
		b.WriteString(head + "\n")
		for _, f := range e.Frames {
			fmt.Fprintf(&b, "  File %q, line %d, in %s\n", f.File, f.Line, f.Function)
		}
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "  line %d\n", e.Line)
	}
	if e.SourceLine != "" && (len(e.Frames) > 0 || e.Line > 0) {
		fmt.Fprintf(&b, "    %s\n", e.SourceLine)
	}
	b.WriteString(last)
	return b.String()
}
