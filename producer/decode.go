package producer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
)

// checkContentType accepts application/json, any +json type, or no
// Content-Type at all (curl --data-binary without -H).
func checkContentType(r *http.Request) *problem {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return newProblem(http.StatusUnsupportedMediaType, job.ProblemUnsupportedMediaType, "Unsupported media type",
		fmt.Sprintf("Content-Type %q is not accepted: send the body as JSON with Content-Type: application/json", ct))
}

// readBody reads the whole request body, at most limit bytes. A body over
// the limit is answered 413, and read and discarded first (drainBody), so
// that a client that sends its whole body before it reads anything
// (Python's urllib) reads the answer instead of a reset connection.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *problem) {
	if p := checkContentType(r); p != nil {
		return nil, p
	}
	tooLarge := func() *problem {
		p := newProblem(http.StatusRequestEntityTooLarge, job.ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("the request body is larger than the maximum of %d bytes; send less code, stdin or files", limit))
		p.Limit = limit
		return p
	}
	if r.ContentLength > limit {
		// Known to be too long: nothing of it is kept.
		drainBody(w, r, r.Body, limit)
		return nil, tooLarge()
	}
	// A known length is read into a buffer of that size, not one grown by
	// doubling, so a body holds no more memory than its length.
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	body := r.Body
	_, err := buf.ReadFrom(http.MaxBytesReader(w, body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		drainBody(w, r, body, limit)
		return nil, tooLarge()
	case err != nil:
		return nil, newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Unreadable request body", "reading the request body failed: "+err.Error())
	}
	return buf.Bytes(), nil
}

// Bounds on reading and discarding a body over the limit.
const (
	// drainFactor × the limit is the most of a refused body read and
	// discarded: a 40 MB submission to a 32 MiB limit is read whole, an
	// endless one is not.
	drainFactor = 4
	// drainTimeout bounds the time spent discarding one body.
	drainTimeout = 30 * time.Second
)

// drainBody reads and discards the rest of body (r's, of a request over
// limit), at most drainFactor × limit bytes within drainTimeout, holding
// no memory for it. A client that sends its whole body before it reads
// the answer then finds the answer waiting: a server that closed with its
// body unread would have reset the connection under it. A client that
// asked to be told before it sends (Expect: 100-continue, as curl does
// for a large body) is told at once, with nothing read. A body past the
// bound still ends the connection after the answer.
func drainBody(w http.ResponseWriter, r *http.Request, body io.Reader, limit int64) {
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		w.Header().Set("Connection", "close")
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(drainTimeout))
	n, err := io.Copy(io.Discard, io.LimitReader(body, drainFactor*limit+1))
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil || n > drainFactor*limit {
		w.Header().Set("Connection", "close")
	}
}

// decodeChecked decodes exactly one JSON value from raw into v. Field names
// must be exactly those schema documents, each at most once per object
// (checkFieldNames); no data may follow the value. where prefixes field
// paths ("jobs[3]."). json.Unmarshal, unlike a json.Decoder, works on raw
// in place, so a large body is not copied into a second buffer.
func decodeChecked(raw []byte, v any, schema *fieldSchema, where string) *problem {
	if len(bytes.TrimSpace(raw)) == 0 {
		return newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Malformed JSON",
			where+"body is empty: send a JSON object such as {\"code\": \"print(1)\"}")
	}
	if p := checkFieldNames(raw, schema, where); p != nil {
		return p
	}
	err := json.Unmarshal(raw, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var inv *job.InvalidError
	switch {
	case errors.As(err, &inv):
		p := newProblem(http.StatusBadRequest, job.ProblemInvalidField, "Invalid field", where+inv.Message)
		p.Field = where + inv.Field
		return p
	case errors.As(err, &syn) && strings.Contains(syn.Error(), "after top-level value"):
		return newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Malformed JSON",
			fmt.Sprintf("%sunexpected data after the JSON object at byte offset %d: send exactly one object", where, syn.Offset))
	case errors.As(err, &syn) && strings.Contains(syn.Error(), "unexpected end of JSON input"):
		return newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Malformed JSON",
			fmt.Sprintf("%smalformed JSON: the body ends early at byte offset %d (an unclosed object, array or string?)", where, len(raw)))
	case errors.As(err, &syn):
		return newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Malformed JSON",
			fmt.Sprintf("%smalformed JSON at byte offset %d: %s", where, syn.Offset, syn.Error()))
	case errors.As(err, &typ):
		p := newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Wrong JSON type",
			fmt.Sprintf("%sfield %q at byte offset %d: JSON %s cannot be a %s", where, typ.Field, typ.Offset, typ.Value, jsonKind(typ.Type.Kind().String())))
		p.Field = where + typ.Field
		return p
	}
	return newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Malformed JSON", where+err.Error())
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "slice":
		return "array"
	case "map", "struct":
		return "object"
	case "bool":
		return "boolean"
	default:
		return "number (" + goKind + ")"
	}
}
