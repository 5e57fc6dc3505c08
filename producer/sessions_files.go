package producer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// fileRoutes serve a session's files (the routes of /v1/sessions/{id}/files).
type fileRoutes struct {
	ss    *sessions
	blobs *blob.Store // checkpoints and files read from them
}

// A session's files. Reads (list, stat, download) answer from the
// checkpoint the holder records after each call, so they show /work as the
// last call (or file operation) left it and never wake the worker. Changes
// (upload, mkdir, move, remove) are file operations: calls of the session
// (they take the next seq, ordered with the calls) that the holder does on
// the session's /work from the host between calls (worker/session_files.go);
// each is answered as an HTTP result of its own (the entry, or a problem),
// not as a call's result. One not done within the wait (?wait=, the
// server's longest when absent) is 202 with the call's pending body: the
// same request with the same Idempotency-Key answers it once it is done.

var sessionFileOpSchema = &fieldSchema{fields: map[string]*fieldSchema{"op": nil, "path": nil, "to": nil, "overwrite": nil}}

// fileRefusals are the API's errors for the refusals a worker records
// (job.SessionFileError codes).
var fileRefusals = map[string]error{
	job.FileErrNotFound: errFileNotFound, job.FileErrExists: errFileExists, job.FileErrNotDir: errFileNotDir,
	job.FileErrIsDir: errFileIsDir, job.FileErrNotEmpty: errFileNotEmpty, job.FileErrSymlink: errFileSymlink,
	job.FileErrMoveIntoSelf: errFileMoveIntoSelf, job.FileErrTooLarge: errFilesFull,
}

// fileRefusal is the domain error of a refusal the session's files caused.
func fileRefusal(e *job.SessionFileError) error {
	kind, ok := fileRefusals[e.Code]
	if !ok {
		kind = errFileExists // a code of a newer worker: something is in the way
	}
	return &refusal{kind: kind, detail: e.Detail, field: e.Field, limit: e.Limit}
}

// fileNotFound is the refusal of a path the checkpoint does not hold.
func fileNotFound(rec cache.SessionRecord, name string) error {
	return &refusal{kind: errFileNotFound, field: "path",
		detail: fmt.Sprintf("session %s has no %q in /work after its last call", rec.ID, name)}
}

// sessionFileOf reads the caller's session and checks r's path ({path},
// or the ?path= parameter when the route has none); an empty path is /work
// itself when dirOK.
func (fr fileRoutes) sessionFileOf(r *http.Request, caller string, dirOK bool) (cache.SessionRecord, string, *problem) {
	ctx := r.Context()
	st, p := fr.ss.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = fr.ss.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		return rec, "", p
	}
	name := r.PathValue("path")
	if name == "" {
		name = strings.TrimSuffix(r.URL.Query().Get("path"), "/")
	}
	if name == "" && dirOK {
		return rec, "", nil
	}
	if err := job.ValidSessionFilePath(name); err != nil {
		return rec, "", fr.ss.problems.toProblem(ctx, "session file", err)
	}
	return rec, name, nil
}

// checkpointEntry is the checkpoint's entry at name, if it has one.
func checkpointEntry(rec cache.SessionRecord, name string) (job.SessionFileEntry, bool) {
	for _, f := range rec.Files {
		if f.Name == name {
			return f, true
		}
	}
	return job.SessionFileEntry{}, false
}

// handleSessionFileGet answers GET (and HEAD) /v1/sessions/{id}/files/{path}:
// the file's bytes as the last call left it, or with ?stat=true its entry.
// The path "" (files/) lists /work.
func (fr fileRoutes) handleSessionFileGet(w http.ResponseWriter, r *http.Request, caller string) {
	if r.PathValue("path") == "" {
		fr.handleSessionFileList(w, r, caller)
		return
	}
	ctx := r.Context()
	stat, p := boolParam(r, "stat")
	if p != nil {
		writeProblem(w, p)
		return
	}
	rec, name, p := fr.sessionFileOf(r, caller, false)
	if p != nil {
		writeProblem(w, p)
		return
	}
	f, ok := checkpointEntry(rec, name)
	switch {
	case !ok:
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", fileNotFound(rec, name)))
		return
	case stat:
		writeJSON(w, http.StatusOK, f.Info())
		return
	case !f.IsFile():
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", &refusal{kind: errFileIsDir, field: "path",
			detail: fmt.Sprintf("%s is a %s, not a file: list a directory with GET /v1/sessions/%s/files?path=%s, describe any entry with ?stat=true",
				name, f.Info().Type, rec.ID, name)}))
		return
	}
	o, err := fr.blobs.Open(ctx, job.ObjectRef{Tenant: rec.Tenant, SHA256: f.SHA256, Size: f.Size})
	if err != nil {
		writeProblem(w, fr.ss.problems.storeProblem(ctx, "session file", err))
		return
	}
	defer o.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(f.Size, 10))
	h.Set("ETag", `"`+f.SHA256+`"`)
	if !f.MTime.IsZero() {
		h.Set("Last-Modified", f.MTime.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, o)
	}
}

// handleSessionFileList answers GET /v1/sessions/{id}/files: the entries
// of the directory ?path= (/work when absent; every entry below it with
// ?recursive=true), by path, at most ?limit= (SessionFileListMax) a page,
// the next page from ?cursor=.
func (fr fileRoutes) handleSessionFileList(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	q := r.URL.Query()
	recursive, p := boolParam(r, "recursive")
	limit := job.SessionFileListMax
	if p == nil && q.Get("limit") != "" {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > job.SessionFileListMax {
			p = badParam("limit", fmt.Sprintf("limit=%q: it must be 1 .. %d", q.Get("limit"), job.SessionFileListMax))
		} else {
			limit = n
		}
	}
	var rec cache.SessionRecord
	var dir string
	if p == nil {
		rec, dir, p = fr.sessionFileOf(r, caller, true)
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if dir != "" {
		f, ok := checkpointEntry(rec, dir)
		if !ok {
			writeProblem(w, fr.ss.problems.toProblem(ctx, "session files", fileNotFound(rec, dir)))
			return
		}
		if f.Type != job.FileTypeDir {
			writeProblem(w, fr.ss.problems.toProblem(ctx, "session files", &refusal{kind: errFileNotDir, field: "path",
				detail: fmt.Sprintf("%s is a %s, not a directory: read it with GET /v1/sessions/%s/files/%s (?stat=true describes it)", dir, f.Info().Type, rec.ID, dir)}))
			return
		}
	}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	cursor := q.Get("cursor")
	out := job.SessionFileList{Path: dir, Entries: []job.SessionFileInfo{}}
	files := slices.Clone(rec.Files)
	slices.SortFunc(files, func(a, b job.SessionFileEntry) int { return strings.Compare(a.Name, b.Name) })
	for _, f := range files {
		rest, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || (!recursive && strings.Contains(rest, "/")) || (cursor != "" && f.Name <= cursor) {
			continue
		}
		if len(out.Entries) == limit {
			out.NextCursor = out.Entries[limit-1].Path
			break
		}
		out.Entries = append(out.Entries, f.Info())
	}
	writeJSON(w, http.StatusOK, out)
}

// handleSessionFilePut writes the body into the session's /work as the
// file {path} (its parents made, a file there replaced): 201 with the
// entry when it is new, 200 when it replaced one.
func (fr fileRoutes) handleSessionFilePut(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	rec, name, p := fr.sessionFileOf(r, caller, false)
	if p != nil {
		writeProblem(w, p)
		return
	}
	r.Header.Del("Content-Type") // any media type: the body is the file
	body, p := readBody(w, r, min(fr.ss.cfg.MaxBodyBytes, sessionFileMax))
	if p != nil {
		writeProblem(w, p)
		return
	}
	// The content goes to the object store (as a checkpoint's files do);
	// the operation names it, so the catalog holds no file bodies.
	sum := sha256.Sum256(body)
	ref := job.ObjectRef{Tenant: rec.Tenant, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body))}
	if err := fr.blobs.Put(ctx, ref, bytes.NewReader(body)); err != nil {
		writeProblem(w, fr.ss.problems.storeProblem(ctx, "session file", fmt.Errorf("%w: store the upload: %w", cache.ErrUnavailable, err)))
		return
	}
	fr.sessionFileOp(w, r, caller, job.SessionFileOp{Op: job.FileOpPut, Path: name, Content: &ref})
}

// handleSessionFileDelete removes {path} from the session's /work (a
// directory with ?recursive=true, or when empty): 204.
func (fr fileRoutes) handleSessionFileDelete(w http.ResponseWriter, r *http.Request, caller string) {
	recursive, p := boolParam(r, "recursive")
	var name string
	if p == nil {
		_, name, p = fr.sessionFileOf(r, caller, false)
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	fr.sessionFileOp(w, r, caller, job.SessionFileOp{Op: job.FileOpRemove, Path: name, Recursive: recursive})
}

// handleSessionFileOp answers POST /v1/sessions/{id}/files: {op: "mkdir",
// path} (201 with the directory, 200 when it was there) or {op: "move",
// path, to, overwrite} (200 with the entry at to).
func (fr fileRoutes) handleSessionFileOp(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	raw, p := readBody(w, r, fr.ss.cfg.MaxBodyBytes)
	if p != nil {
		writeProblem(w, p)
		return
	}
	var op job.SessionFileOp
	if p := decodeChecked(raw, &op, sessionFileOpSchema, ""); p != nil {
		writeProblem(w, p)
		return
	}
	if op.Op == job.FileOpPut || op.Op == job.FileOpRemove {
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", &job.InvalidError{Field: "op",
			Message: fmt.Sprintf("op %q is not sent here: PUT /v1/sessions/{id}/files/{path} writes a file, DELETE removes one", op.Op)}))
		return
	}
	if err := op.Validate(); err != nil {
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", err))
		return
	}
	fr.sessionFileOp(w, r, caller, op)
}

// sessionFileOp accepts op as the session's next call and answers its
// outcome: the entry (201 when made, 200; 204 for a remove), the problem
// the session's files make of it, or 202 while it waits its turn.
func (fr fileRoutes) sessionFileOp(w http.ResponseWriter, r *http.Request, caller string, op job.SessionFileOp) {
	ctx := fr.ss.traced(r)
	if err := op.Validate(); err != nil {
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", err))
		return
	}
	// ?wait= as for calls; absent, the longest the server waits.
	wait, p := fr.ss.waits.parseWait(r)
	if p != nil {
		writeProblem(w, p)
		return
	}
	if !r.URL.Query().Has("wait") {
		wait = fr.ss.cfg.MaxWait
	}
	ans, p := fr.ss.runSessionCall(ctx, caller, r.PathValue("id"), job.SessionCall{File: &op}, r.Header.Get("Idempotency-Key"), wait)
	if p != nil {
		writeProblem(w, p)
		return
	}
	if ans.pending != nil {
		writeCallAnswer(w, ans)
		return
	}
	fr.writeFileOutcome(ctx, w, ans.res)
}

// writeFileOutcome answers a file operation's call result.
func (fr fileRoutes) writeFileOutcome(ctx context.Context, w http.ResponseWriter, res job.CallResult) {
	out := res.File
	switch {
	case out != nil && out.Error != nil:
		writeProblem(w, fr.ss.problems.toProblem(ctx, "session file", fileRefusal(out.Error)))
	case out == nil || res.Status != job.StatusSucceeded:
		// Not done, nor refused: the worker failed (or was lost while it
		// did it; it is never done twice).
		msg := "the file operation did not complete"
		if res.Error != nil {
			msg = res.Error.Message
		}
		p := newProblem(http.StatusInternalServerError, job.ProblemInternal, "File operation failed",
			fmt.Sprintf("call %d of the session: %s", res.Seq, msg))
		writeProblem(w, p)
	case out.Op == job.FileOpRemove:
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	case out.Created:
		writeJSON(w, http.StatusCreated, out.Entry)
	default:
		writeJSON(w, http.StatusOK, out.Entry)
	}
}

// boolParam reads the query parameter name: absent, "false" or "0" is
// false; "true", "1" or present without a value is true.
func boolParam(r *http.Request, name string) (bool, *problem) {
	q := r.URL.Query()
	if !q.Has(name) {
		return false, nil
	}
	switch q.Get(name) {
	case "", "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, badParam(name, fmt.Sprintf("%s=%q: it must be true or false", name, q.Get(name)))
}
