package producer

import (
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
	ctx := r.Context()
	st, p := s.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessionOf(ctx, st, caller, r.PathValue("id"))
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	name := r.PathValue("path")
	if err := job.ValidSessionFilePath(name); err != nil {
		writeProblem(w, s.toProblem(ctx, "session file", err))
		return
	}
	for _, f := range rec.Files {
		if f.Name != name {
			continue
		}
		o, err := s.blobs.Open(ctx, job.ObjectRef{Tenant: rec.Tenant, SHA256: f.SHA256, Size: f.Size})
		if err != nil {
			writeProblem(w, s.storeProblem(ctx, "session file", err))
			return
		}
		defer o.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
		w.Header().Set("ETag", `"`+f.SHA256+`"`)
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, o)
		return
	}
	writeProblem(w, newProblem(http.StatusNotFound, job.ProblemNotFound, "File not found",
		fmt.Sprintf("session %s has no file %q in /work after its last call", rec.ID, name)))
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
	call := job.SessionCall{Code: "pass", Files: []job.File{{Name: name, Content: base64.StdEncoding.EncodeToString(body), Encoding: "base64"}}}
	s.execCall(w, r, caller, call, s.cfg.MaxWait)
}
