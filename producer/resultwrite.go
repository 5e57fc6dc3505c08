package producer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/resultio"
	"github.com/kilnrun/kiln/job"
)

// writeRendered answers status with rv's JSON made from its template, in
// a pooled buffer, unless the template cannot write it (an id or trace id
// that needs escaping): then it returns false and writes nothing.
func writeRendered(w http.ResponseWriter, status int, rv *resultView) bool {
	buf := answerBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	buf.Reset()
	buf.Grow(len(rv.tmpl.middle) + 3*len(rv.ID) + len(rv.TraceID) + 256) // what render adds, with room
	b, ok := rv.tmpl.render(buf.AvailableBuffer(), rv.ID, rv.TraceID, *rv.CreatedAt)
	if !ok {
		return false
	}
	writeJSONBytes(w, status, b)
	return true
}

// lazyHeader sends the header with the first byte of the body, so a failure
// before any byte is written can still be answered with a problem.
type lazyHeader struct {
	w      http.ResponseWriter
	status int
	sent   bool
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	if !l.sent {
		l.sent = true
		h := l.w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		l.w.WriteHeader(l.status)
	}
	return l.w.Write(p)
}

// resultWriter writes Results whose output may live in the object store
// (internal/resultio): streamed to one answer, or read back whole for
// answers that hold several.
type resultWriter struct {
	blobs    *blob.Store
	cfg      *Config // MaxListBytes
	problems *problems
	log      *slog.Logger
}

// openObject opens a stored object for resultio, spooled to a temporary
// file so a slow client never stalls the object store's consumer.
func (rw *resultWriter) openObject(ctx context.Context, ref job.ObjectRef) (io.ReadCloser, error) {
	return rw.blobs.OpenSpooled(ctx, ref, "")
}

// writeBody answers status with body as JSON. A Result whose output is in
// the object store (job.Result.StdoutObject) is streamed: its output is read
// from the store and escaped into the answer as it is sent, so the answer is
// never built in memory whatever the job printed. Such an answer has no
// Content-Length.
func (rw *resultWriter) writeBody(ctx context.Context, w http.ResponseWriter, status int, body any) {
	rv, ok := body.(*resultView)
	if ok && rv.tmpl != nil && writeRendered(w, status, rv) {
		return
	}
	if !ok || !rv.Spilled() {
		writeJSON(w, status, body)
		return
	}
	lw := &lazyHeader{w: w, status: status}
	err := resultio.Write(ctx, lw, &rv.Result, func() ([]byte, error) { return marshal(rv) }, rw.openObject)
	if err == nil {
		return
	}
	if !lw.sent {
		// Nothing was sent: the object store did not answer, or the output
		// is gone. Say so instead of a result without its output.
		writeProblem(w, rw.outputProblem(ctx, rv.ID, err))
		return
	}
	rw.log.WarnContext(ctx, "stream result: the answer was cut short", slog.String("job_id", rv.ID), slog.Any("error", err))
	panic(http.ErrAbortHandler) // the client sees a broken answer, never a short one
}

// outputProblem describes a result whose stored output could not be read.
func (rw *resultWriter) outputProblem(ctx context.Context, id string, err error) *problem {
	if errors.Is(err, blob.ErrNotFound) {
		return newProblem(http.StatusNotFound, job.ProblemNotFound, "Output expired",
			fmt.Sprintf("the output of job %s is no longer stored; submit the job again", id))
	}
	return rw.problems.storeProblem(ctx, "read job output", fmt.Errorf("%w: %w", cache.ErrUnavailable, err))
}

// loadOutput reads a Result's stored output back into it, for answers that
// need it whole (lists, tool calls).
func (rw *resultWriter) loadOutput(ctx context.Context, r *job.Result) error {
	return resultio.Load(ctx, rw.openObject, r)
}

// inlineOutput reads the stored output of a Result in an answer that holds
// several jobs (lists, batches) back into it, within *budget bytes of
// output for the whole answer: beyond it, or when the output can't be
// read, the job is answered with a problem naming the route that streams it.
func (rw *resultWriter) inlineOutput(ctx context.Context, rv *resultView, budget *int64) *problem {
	if !rv.Spilled() {
		return nil
	}
	n := resultio.SpilledBytes(&rv.Result)
	if n > *budget {
		p := newProblem(http.StatusRequestEntityTooLarge, job.ProblemResponseTooLarge, "Response too large",
			fmt.Sprintf("job %s (%s) was not included: its %d bytes of output would take the answer over its bound of %d bytes; GET /v1/jobs/%s", rv.ID, rv.Status, n, rw.cfg.MaxListBytes, rv.ID))
		p.Limit = rw.cfg.MaxListBytes
		return p
	}
	if err := rw.loadOutput(ctx, &rv.Result); err != nil {
		return rw.outputProblem(ctx, rv.ID, err)
	}
	*budget -= n
	return nil
}
