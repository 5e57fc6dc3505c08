package producer

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// A session's files: what its last call left in /work (the checkpoint),
// read and written between calls.

// handleSessionFileGet answers a file of the session's /work as its last
// call left it (the checkpoint).
func (s *Server) handleSessionFileGet(w http.ResponseWriter, r *http.Request, caller string) {
	o, size, p := (&Domain{s: s}).openSessionFile(r.Context(), caller, r.PathValue("id"), r.PathValue("path"))
	if p != nil {
		writeProblem(w, p)
		return
	}
	defer o.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("ETag", `"`+o.sha256+`"`)
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, o)
}

// sessionFile is a file of a session's /work being read.
type sessionFile struct {
	io.ReadCloser
	sha256 string
}

// openSessionFile opens file name of caller's session id as its last call
// left it (the checkpoint).
func (d *Domain) openSessionFile(ctx context.Context, caller, id, name string) (*sessionFile, int64, *problem) {
	s := d.s
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, id)
	}
	if p != nil {
		return nil, 0, p
	}
	if err := job.ValidSessionFilePath(name); err != nil {
		return nil, 0, s.toProblem(ctx, "session file", err)
	}
	for _, f := range rec.Files {
		if f.Name != name {
			continue
		}
		o, err := s.blobs.Open(ctx, job.ObjectRef{Tenant: rec.Tenant, SHA256: f.SHA256, Size: f.Size})
		if err != nil {
			return nil, 0, s.storeProblem(ctx, "session file", err)
		}
		return &sessionFile{ReadCloser: o, sha256: f.SHA256}, f.Size, nil
	}
	return nil, 0, newProblem(http.StatusNotFound, job.ProblemNotFound, "File not found",
		fmt.Sprintf("session %s has no file %q in /work after its last call", rec.ID, name))
}

// handleSessionFilePut writes a file into the session's /work: a call of
// the session (it takes the next seq), so it is ordered with the calls.
func (s *Server) handleSessionFilePut(w http.ResponseWriter, r *http.Request, caller string) {
	name := r.PathValue("path")
	if err := job.ValidSessionFilePath(name); err != nil {
		writeProblem(w, s.toProblem(r.Context(), "session file", err))
		return
	}
	r.Header.Del("Content-Type") // any media type: the body is the file
	body, p := readBody(w, r, min(s.cfg.MaxBodyBytes, sessionFileMax))
	if p != nil {
		writeProblem(w, p)
		return
	}
	s.execCall(w, r, caller, fileCall(name, body), s.cfg.MaxWait)
}

// fileCall is the session call that writes body to name in /work.
func fileCall(name string, body []byte) job.SessionCall {
	return job.SessionCall{Code: "pass", Files: []job.File{{Name: name, Content: base64.StdEncoding.EncodeToString(body), Encoding: "base64"}}}
}
